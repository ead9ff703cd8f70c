"""One layer's attention time on the CPU, the in-place path against the padded gather it replaced; not a test.

    python benchmarks/cpu_attention.py            # float32, 1 thread, Qwen3-0.6B's heads (16/8, head_dim 128)

Prints one markdown table: a row per (batch, context length, block layout), the median milliseconds of one
decode step's attention for one layer (the new keys written, then B queries of one token each), old
(`padded_attention`), new (`in_place_attention`) and the torch backend, which takes whichever
`in_place_pays` says. "consecutive" gives each request a run of block ids (a
prompt allocated at once); "interleaved" deals the blocks out round-robin, as B requests decoding together
allocate them (plus one other request's block per round), so the new path gathers each request's blocks;
"chunked" is what the engine's chunked prefill beside decodes leaves: each request's prompt in runs of 32
blocks (512-token chunks) scattered among the other requests' chunks, its last 4 blocks (decoded) dealt
out round-robin. "verify" rows attend 8 queries per request (a K = 7 verification) instead of 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from openinfer.benchmarks.model_step import median_ms
from openinfer.kernels.attention import TorchAttentionBackend, padded_attention
from openinfer.kernels.attention_backend import write_kv_cache
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.cpu_attention import in_place_attention

BLOCK_SIZE = 16
CONTEXTS = (64, 256, 1024, 4096)
BATCHES = (1, 8)


CHUNK_BLOCKS = 32  # a 512-token prompt chunk's blocks, allocated together
DECODED_BLOCKS = 4


def block_tables(batch: int, n: int, layout: str) -> list[list[int]]:
    """Each of `batch` requests' `n` block ids in `layout` (consecutive, interleaved or chunked), ids below
    (batch + 1) * n."""
    stride = batch + 1  # one more request's block in each round, so a lone request's are scattered too
    if layout == "consecutive":
        return [list(range(b * n, (b + 1) * n)) for b in range(batch)]
    if layout == "interleaved":  # block j of request b is round j's b-th allocation
        return [[j * stride + b for j in range(n)] for b in range(batch)]
    prompt = max(n - DECODED_BLOCKS, 0)
    chunks = -(-prompt // CHUNK_BLOCKS)
    # chunk c of request b at slot (c * stride + b) of CHUNK_BLOCKS ids; the decoded blocks after all chunks
    tables = []
    for b in range(batch):
        table = [(c * stride + b) * CHUNK_BLOCKS + i for c in range(chunks) for i in range(CHUNK_BLOCKS)]
        decoded = [chunks * stride * CHUNK_BLOCKS + j * stride + b for j in range(n - prompt)]
        tables.append(table[:prompt] + decoded)
    return tables


def attention_case(
    batch: int, context: int, layout: str, queries: int, heads: tuple[int, int, int], dtype: torch.dtype
) -> list[Callable[[], object]]:
    """The old, the new and the backend's call for `batch` requests of `queries` new tokens each over
    `context` cached tokens each."""
    num_heads, num_kv_heads, head_dim = heads
    n = -(-(context + queries) // BLOCK_SIZE)
    tables = block_tables(batch, n, layout)
    g = torch.Generator().manual_seed(0)
    num_blocks = max(max(table) for table in tables) + 1
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=g).to(dtype)
    meta = AttentionMetadata.build(
        [context] * batch, [queries] * batch, tables, BLOCK_SIZE, torch.device("cpu")
    )
    tokens = batch * queries
    q = torch.randn(tokens, num_heads, head_dim, generator=g).to(dtype)
    k, v = (torch.randn(tokens, num_kv_heads, head_dim, generator=g).to(dtype) for _ in range(2))
    scale = head_dim**-0.5

    def step(attend: Callable[..., torch.Tensor]) -> Callable[[], object]:
        def call() -> object:
            write_kv_cache(cache, k, v, meta.slot_mapping)
            return attend(q, cache, meta, scale)

        return call

    backend = TorchAttentionBackend(reads_in_place=True)
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
    parser.add_argument("--queries", type=int, nargs="+", default=[1, 8], help="new tokens per request")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype}, {args.threads} thread(s), heads {args.heads}, block size {BLOCK_SIZE}")
    print("| step | batch | context | blocks | old ms | new ms | backend ms | old / backend |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    with torch.inference_mode():
        for queries in args.queries:
            for batch in BATCHES:
                for context in CONTEXTS:
                    for layout in ("consecutive", "interleaved", "chunked"):
                        calls = attention_case(batch, context, layout, queries, tuple(args.heads), dtype)
                        old_ms, new_ms, backend_ms = (median_ms(call, 3, args.iters) for call in calls)
                        step = "decode" if queries == 1 else f"verify {queries}"
                        print(
                            f"| {step} | {batch} | {context} | {layout} | {old_ms:.3f} | {new_ms:.3f} "
                            f"| {backend_ms:.3f} | {old_ms / backend_ms:.2f}x |",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
