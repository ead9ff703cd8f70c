"""The CPU in-place attention against the padded reference (`padded_attention`)."""

from __future__ import annotations

import pytest
import torch

from openinfer.kernels.attention import padded_attention
from openinfer.kernels.attention_backend import write_kv_cache
from openinfer.kernels.attention_metadata import AttentionMetadata, BlockRun
from openinfer.kernels.cpu_attention import in_place_attention, in_place_pays

# (context_len, query_len) per request: decodes over ragged contexts (one at a block boundary), a fresh
# prefill, a chunk after a context, a verification of K + 1 = 4 tokens.
MIXED = [(37, 1), (0, 21), (48, 1), (29, 13), (70, 4), (1, 1)]
DECODES = [(5, 1), (100, 1), (31, 1), (64, 1)]
# Decodes past GATHER_PIECE_BLOCKS (32) blocks of 16 (512 tokens): scattered ones fold pieces into an
# online softmax, the last piece partial (1,100 keys = 2 full pieces + 76) or exactly full (1,024 keys).
LONG_DECODES = [(1099, 1), (1023, 1), (600, 1)]
# Verifications over long contexts: the causal mask falls in the last piece or across two (16 queries at
# 1,016..1,031 straddle the 1,024-key piece boundary); 17 queries take the flash kernel over all its keys.
LONG_VERIFIES = [(1095, 5), (1016, 16), (600, 17)]
HEADS = [(4, 2, 16), (4, 4, 8), (8, 1, 16)]  # (num_heads, num_kv_heads, head_dim): GQA 2, MHA, MQA


def tables_for(requests: list[tuple[int, int]], block_size: int, layout: str) -> list[list[int]]:
    """Each request's blocks: consecutive ids in request order ("views"), the next of a shuffled pool
    ("gathers"), or runs of 1-9 consecutive ids in shuffled order ("runs": long runs are views, short ones
    gathered between them, as a chunked prompt's blocks beside decodes' single blocks)."""
    sizes = [-(-(c + q) // block_size) for c, q in requests]
    pool = list(range(sum(sizes)))
    g = torch.Generator().manual_seed(3)
    if layout == "gathers":
        pool = torch.randperm(len(pool), generator=g).tolist()
    elif layout == "runs":
        runs, start = [], 0
        while start < len(pool):
            length = int(torch.randint(1, 10, (1,), generator=g))
            runs.append(pool[start : start + length])
            start += length
        pool = [block for i in torch.randperm(len(runs), generator=g).tolist() for block in runs[i]]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [pool[s : s + n] for s, n in zip(starts, sizes, strict=True)]


@pytest.mark.parametrize(
    "requests",
    [MIXED, DECODES, LONG_DECODES, LONG_VERIFIES],
    ids=["mixed", "decodes", "long-decodes", "long-verifies"],
)
@pytest.mark.parametrize("heads", HEADS, ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("layout", ["views", "gathers", "runs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_in_place_matches_padded_reference(
    requests: list[tuple[int, int]],
    heads: tuple[int, int, int],
    block_size: int,
    layout: str,
    dtype: torch.dtype,
) -> None:
    """Mixed, decode and verification batches over consecutive (view), scattered (gathered) or run-shaped
    blocks: the in-place outputs equal the padded reference's to float tolerance, for every head layout,
    block size and dtype."""
    g = torch.Generator().manual_seed(0)
    num_heads, num_kv_heads, head_dim = heads
    tables = tables_for(requests, block_size, layout)
    num_blocks = sum(len(t) for t in tables) + 1  # + the padded tables' block 0 stays valid
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    meta = AttentionMetadata.build(
        [c for c, _ in requests], [q for _, q in requests], tables, block_size, torch.device("cpu")
    )
    q = torch.randn(meta.num_tokens, num_heads, head_dim, generator=g).to(dtype)
    k, v = (torch.randn(meta.num_tokens, num_kv_heads, head_dim, generator=g).to(dtype) for _ in range(2))
    write_kv_cache(cache, k, v, meta.slot_mapping)
    scale = head_dim**-0.5

    got = in_place_attention(q, cache, meta, scale)
    expected = padded_attention(q, cache, meta, scale)

    assert got.shape == expected.shape and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 keeps 8 bits of mantissa
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)


def test_block_runs() -> None:
    """Each request's used blocks split into runs of consecutive ids, in table order; blocks past its keys
    (a padded or over-allocated table) are not part of any run."""
    tables = [[4, 5, 0], [9, 10, 11], [7, 9, 8], [3, 4, 20, 21]]
    meta = AttentionMetadata.build([20, 3, 40, 50], [1, 1, 1, 2], tables, 16, torch.device("cpu"))
    # 21 keys = blocks 4, 5 (table padded with 0); 4 keys = block 9 of three allocated; 41 keys over 7, 9, 8
    # (ends 7 and 8 are not a run); 52 keys = 3, 4 then 20, 21
    assert meta.block_runs == [
        [BlockRun(0, 4, 2)],
        [BlockRun(0, 9, 1)],
        [BlockRun(0, 7, 1), BlockRun(1, 9, 1), BlockRun(2, 8, 1)],
        [BlockRun(0, 3, 2), BlockRun(2, 20, 2)],
    ]


def test_in_place_pays() -> None:
    """A lone request reads in place, and so does a batch of unequal query lengths; a batch of equal ones
    does only once its padded gather passes the limit."""
    cache = torch.zeros(2, 1, 16, 8, 128)  # float32, 8 KV heads of 128: 8 KiB of keys+values per token
    small = AttentionMetadata.build([127, 127], [1, 1], [[0] * 8, [0] * 8], 16, torch.device("cpu"))
    large = AttentionMetadata.build([600, 600], [1, 1], [[0] * 38, [0] * 38], 16, torch.device("cpu"))
    lone = AttentionMetadata.build([10], [1], [[0]], 16, torch.device("cpu"))
    assert not in_place_pays(cache, small)  # 2 x 128 tokens x 8 KiB = 2 MiB <= 8 MiB
    assert in_place_pays(cache, large)  # 2 x 601 tokens x 8 KiB > 8 MiB
    assert in_place_pays(cache, lone)
    mixed = AttentionMetadata.build([0, 127], [4, 1], [[0], [0] * 8], 16, torch.device("cpu"))
    assert in_place_pays(cache, mixed)  # small, but padded would run the decode at 4 queries
