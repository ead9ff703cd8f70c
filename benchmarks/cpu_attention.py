"""One layer's attention time on the CPU, the in-place path against the padded gather it replaced; not a test.

    python benchmarks/cpu_attention.py            # float32, 1 thread, Qwen3-0.6B's heads (16/8, head_dim 128)

Prints one markdown table: a row per (batch, context length, block layout), the median milliseconds of one
decode step's attention for one layer (the new keys written, then B queries of one token each), old
(`padded_attention`), new (`in_place_attention`) and the torch backend, which takes whichever
`in_place_pays` says. "consecutive" gives each request a run of block ids (a
prompt allocated at once); "interleaved" deals the blocks out round-robin, as B requests decoding together
allocate them (plus one other request's block per round), so the new path gathers each request's blocks.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from openinfer.benchmarks.model_step import median_ms
from openinfer.kernels.attention import (
    AttentionMetadata,
    TorchAttentionBackend,
    padded_attention,
    write_kv_cache,
)
from openinfer.kernels.cpu_attention import in_place_attention

BLOCK_SIZE = 16
CONTEXTS = (64, 256, 1024, 4096)
BATCHES = (1, 8)


def decode_case(
    batch: int, context: int, interleaved: bool, heads: tuple[int, int, int], dtype: torch.dtype
) -> list[Callable[[], object]]:
    """The old, the new and the backend's call for `batch` decodes over `context` cached tokens each."""
    num_heads, num_kv_heads, head_dim = heads
    n = -(-(context + 1) // BLOCK_SIZE)
    # interleaved: block j of request b is round j's b-th allocation, one more request's block in each round
    # (so that a lone request's blocks are scattered too)
    stride = batch + 1
    if interleaved:
        tables = [[j * stride + b for j in range(n)] for b in range(batch)]
    else:
        tables = [list(range(b * n, (b + 1) * n)) for b in range(batch)]
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, stride * n, BLOCK_SIZE, num_kv_heads, head_dim, generator=g).to(dtype)
    meta = AttentionMetadata.build([context] * batch, [1] * batch, tables, BLOCK_SIZE, torch.device("cpu"))
    q = torch.randn(batch, num_heads, head_dim, generator=g).to(dtype)
    k, v = (torch.randn(batch, num_kv_heads, head_dim, generator=g).to(dtype) for _ in range(2))
    scale = head_dim**-0.5

    def step(attend: Callable[..., torch.Tensor]) -> Callable[[], object]:
        def call() -> object:
            write_kv_cache(cache, k, v, meta.slot_mapping)
            return attend(q, cache, meta, scale)

        return call

    backend = TorchAttentionBackend()
    return [
        step(padded_attention),
        step(in_place_attention),
        lambda: backend.forward(q, k, v, cache, meta, scale),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--heads", type=int, nargs=3, default=[16, 8, 128], metavar=("H", "HKV", "D"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype}, {args.threads} thread(s), heads {args.heads}, block size {BLOCK_SIZE}")
    print("| batch | context | blocks | old ms | new ms | backend ms | old / backend |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    with torch.inference_mode():
        for batch in BATCHES:
            for context in CONTEXTS:
                for interleaved in (False, True):
                    calls = decode_case(batch, context, interleaved, tuple(args.heads), dtype)
                    old_ms, new_ms, backend_ms = (median_ms(call, 3, args.iters) for call in calls)
                    layout = "interleaved" if interleaved else "consecutive"
                    print(
                        f"| {batch} | {context} | {layout} | {old_ms:.3f} | {new_ms:.3f} | {backend_ms:.3f} "
                        f"| {old_ms / backend_ms:.2f}x |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
