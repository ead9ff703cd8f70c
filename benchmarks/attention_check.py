"""The Triton paged-attention kernels' largest error against the torch backend, as a table; not a test.

    python benchmarks/attention_check.py        # CUDA (or the CPU under TRITON_INTERPRET=1: slow)

Each row: one step shape (decode, or a mixed step of prefill chunks and a verification), a head layout and a
dtype; random queries, keys, values and cache contents over scattered block tables. The reference is the
torch backend in float32 on the same values; the error is the largest absolute difference of the outputs.
"""

from __future__ import annotations

import torch

from openinfer.kernels.attention import AttentionMetadata, TorchAttentionBackend
from openinfer.kernels.triton_attention import TritonAttentionBackend

SHAPES = {  # (context_len, query_len) per request
    "decode, 8 requests": [(c, 1) for c in (0, 15, 100, 37, 511, 1023, 64, 2047)],
    "prefill + verify": [(0, 37), (40, 25), (9, 1), (900, 8), (0, 1), (24, 8)],
}
HEADS = [(32, 8, 128), (16, 16, 64)]  # (num_heads, num_kv_heads, head_dim)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BLOCK_SIZE = 16


def max_error(requests: list[tuple[int, int]], heads: tuple[int, int, int], dtype: torch.dtype) -> float:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(0)
    num_heads, num_kv_heads, head_dim = heads
    sizes = [-(-(c + q) // BLOCK_SIZE) for c, q in requests]
    pool = torch.randperm(sum(sizes), generator=g).tolist()
    tables = [pool[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(len(sizes))]
    meta = AttentionMetadata.build(
        [c for c, _ in requests], [q for _, q in requests], tables, BLOCK_SIZE, device
    )
    q = torch.randn(meta.num_tokens, num_heads, head_dim, generator=g)
    k, v = (torch.randn(meta.num_tokens, num_kv_heads, head_dim, generator=g) for _ in range(2))
    cache = torch.randn(2, len(pool), BLOCK_SIZE, num_kv_heads, head_dim, generator=g)
    scale = head_dim**-0.5
    low = [t.to(device, dtype) for t in (q, k, v, cache)]
    reference = [t.to(dtype).float().to(device) for t in (q, k, v, cache)]  # the same rounded values
    got = TritonAttentionBackend().forward(*low, meta, scale).float()
    expected = TorchAttentionBackend().forward(*reference, meta, scale)
    return (got - expected).abs().max().item()


def main() -> None:
    print("| step | heads (q/kv x dim) | dtype | max abs error |")
    print("|---|---|---|---:|")
    for name, requests in SHAPES.items():
        for heads in HEADS:
            for dtype in DTYPES:
                error = max_error(requests, heads, dtype)
                layout = f"{heads[0]}/{heads[1]} x {heads[2]}"
                print(
                    f"| {name} | {layout} | {str(dtype).removeprefix('torch.')} | {error:.2e} |", flush=True
                )


if __name__ == "__main__":
    main()
