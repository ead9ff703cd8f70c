"""The Triton DFlash block-attention kernel against the torch path (BlockContext.gather + SDPA): on CUDA when
present, otherwise on the CPU under TRITON_INTERPRET=1 (tests/conftest.py). Cases stay tiny."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from openinfer.engine_core.models.block_attention import BlockContext, torch_block_attention
from openinfer.kernels.triton_dflash_attention import block_attention_triton
from tests.kernels.draft_blocks import DTYPES, HEADS, PAGE, REQUESTS, TOLERANCE, Blocks, make_blocks


def triton_out(blocks: Blocks, context: BlockContext | None = None) -> Tensor:
    c = context or blocks.context
    scale = blocks.q.shape[-1] ** -0.5
    return block_attention_triton(
        blocks.q, blocks.k, blocks.v, blocks.cache, c.block_tables, c.context_lens, c.block_lens, scale
    )


def check_against_torch(blocks: Blocks, dtype: torch.dtype) -> None:
    """The kernel's output equals the torch path's (run in float32 on the same values) to the dtype's
    tolerance, at every slot of every block, padding slots' queries included."""
    f = [t.float() for t in (blocks.q, blocks.k, blocks.v, blocks.cache)]
    expected = torch_block_attention(*f, blocks.context, blocks.q.shape[-1] ** -0.5)
    out = triton_out(blocks)
    assert out.shape == blocks.q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa4"])
def test_triton_block_attention_matches_torch(
    heads: tuple[int, int], head_dim: int, dtype: torch.dtype
) -> None:
    """Ragged contexts (0 included) over shuffled pages and ragged block lengths agree with the torch path."""
    check_against_torch(make_blocks(REQUESTS, heads, head_dim, dtype), dtype)


@pytest.mark.parametrize("seed", [1, 2])
def test_triton_block_attention_random_cases(seed: int) -> None:
    """Random requests (context lengths 0..80, block lengths 1..T) in blocks of width 1, 9 (not a power of
    two) and 17 (two query tiles: 16 slots x 4 heads of a KV head fill the 64 rows of one)."""
    g = torch.Generator().manual_seed(seed)
    for block_width in (1, 9, 17):
        contexts = torch.randint(0, 81, (3,), generator=g).tolist()
        lengths = torch.randint(1, block_width + 1, (3,), generator=g).tolist()
        blocks = make_blocks(
            list(zip(contexts, lengths, strict=True)), (8, 2), 64, torch.float32, block_width
        )
        check_against_torch(blocks, torch.float32)


def test_triton_block_attention_reads_only_what_it_attends() -> None:
    """Table columns past a request's context may hold any page id (never read); a padding row with no keys
    at all (context 0, block 0) gives zeros, not NaN, and leaves the other rows' outputs unchanged."""
    blocks = make_blocks(REQUESTS + [(0, 0)], (4, 2), 64, torch.float32)
    c = blocks.context
    garbage = c.block_tables.clone()
    for row, (context_len, _) in enumerate(REQUESTS):
        garbage[row, -(-context_len // PAGE) :] = 10**6  # far past the cache: reading one would fail
    garbage[-1] = 10**6
    out = triton_out(blocks, BlockContext(garbage, c.context_lens, c.block_lens, 0, PAGE, c.block_width))
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))
    head_dim = blocks.q.shape[-1]
    without_padding = BlockContext(
        c.block_tables[:-1], c.context_lens[:-1], c.block_lens[:-1], c.max_context_len, PAGE, c.block_width
    )
    expected = torch_block_attention(
        blocks.q[:-1], blocks.k[:-1], blocks.v[:-1], blocks.cache, without_padding, head_dim**-0.5
    )
    torch.testing.assert_close(out[:-1], expected, atol=1e-5, rtol=1e-5)
