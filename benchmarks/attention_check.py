"""The Triton attention kernels' largest error against the torch paths, as a table; not a test.

    python benchmarks/attention_check.py        # CUDA (or the CPU under TRITON_INTERPRET=1: slow)

Each row: one step shape (decode, or a mixed step of prefill chunks and a verification), a head layout and a
dtype; random queries, keys, values and cache contents over scattered block tables. The reference is the
torch backend in float32 on the same values; the error is the largest absolute difference of the outputs.
The DFlash rows do the same for the drafter's block-attention kernel against its torch path (gather + SDPA).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from openinfer.engine_core.models.block_attention import BlockContext, torch_block_attention
from openinfer.kernels.attention import TorchAttentionBackend
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.triton_attention import TritonAttentionBackend
from openinfer.kernels.triton_dflash_attention import block_attention_triton

SHAPES = {  # (context_len, query_len) per request
    "decode, 8 requests": [(c, 1) for c in (0, 15, 100, 37, 511, 1023, 64, 2047)],
    "prefill + verify": [(0, 37), (40, 25), (9, 1), (900, 8), (0, 1), (24, 8)],
}
DFLASH_BLOCKS = [(0, 16), (15, 1), (100, 9), (511, 16), (1023, 4), (2047, 16)]  # (context_len, block_len)
DFLASH_WIDTH = 16  # T, every block's padded width
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
    low_q, low_k, low_v, low_cache = (t.to(device, dtype) for t in (q, k, v, cache))
    # the same rounded values, in float32
    ref_q, ref_k, ref_v, ref_cache = (t.to(dtype).float().to(device) for t in (q, k, v, cache))
    got = TritonAttentionBackend().forward(low_q, low_k, low_v, low_cache, meta, scale).float()
    expected = TorchAttentionBackend(reads_in_place=False).forward(
        ref_q, ref_k, ref_v, ref_cache, meta, scale
    )
    return (got - expected).abs().max().item()


def dflash_max_error(heads: tuple[int, int, int], dtype: torch.dtype) -> float:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(0)
    num_heads, num_kv_heads, head_dim = heads
    b, t = len(DFLASH_BLOCKS), DFLASH_WIDTH
    sizes = [-(-c // BLOCK_SIZE) for c, _ in DFLASH_BLOCKS]
    pool = torch.randperm(sum(sizes), generator=g).tolist()
    tables = [
        pool[sum(sizes[:i]) : sum(sizes[: i + 1])] + [0] * (max(sizes) - s) for i, s in enumerate(sizes)
    ]

    def lens(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    context = BlockContext(
        block_tables=lens([page for table in tables for page in table]).view(b, max(sizes)),
        context_lens=lens([c for c, _ in DFLASH_BLOCKS]),
        block_lens=lens([n for _, n in DFLASH_BLOCKS]),
        max_context_len=max(c for c, _ in DFLASH_BLOCKS),
        page_size=BLOCK_SIZE,
        block_width=t,
    )
    q = torch.randn(b, t, num_heads, head_dim, generator=g)
    k, v = (torch.randn(b, t, num_kv_heads, head_dim, generator=g) for _ in range(2))
    cache = torch.randn(2, len(pool), BLOCK_SIZE, num_kv_heads, head_dim, generator=g)
    scale = head_dim**-0.5
    low_q, low_k, low_v, low_cache = (x.to(device, dtype) for x in (q, k, v, cache))
    # the same rounded values, in float32
    ref_q, ref_k, ref_v, ref_cache = (x.to(dtype).float().to(device) for x in (q, k, v, cache))
    got = block_attention_triton(
        low_q, low_k, low_v, low_cache, context.block_tables, context.context_lens, context.block_lens, scale
    ).float()
    expected = torch_block_attention(ref_q, ref_k, ref_v, ref_cache, context, scale)
    return (got - expected).abs().max().item()


def main() -> None:
    print("| step | heads (q/kv x dim) | dtype | max abs error |")
    print("|---|---|---|---:|")
    cases: dict[str, Callable[[tuple[int, int, int], torch.dtype], float]] = {
        name: partial(max_error, requests) for name, requests in SHAPES.items()
    }
    cases[f"dflash block, {len(DFLASH_BLOCKS)} blocks of {DFLASH_WIDTH}"] = dflash_max_error
    for name, error_of in cases.items():
        for heads in HEADS:
            for dtype in DTYPES:
                error = error_of(heads, dtype)
                layout = f"{heads[0]}/{heads[1]} x {heads[2]}"
                print(
                    f"| {name} | {layout} | {str(dtype).removeprefix('torch.')} | {error:.2e} |", flush=True
                )


if __name__ == "__main__":
    main()
