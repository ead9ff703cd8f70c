"""The CPU's in-place draft-block attention (`block_attention_in_place`: context pages read as views or
gathered in pieces, under one online softmax) against the torch reference (BlockContext.gather + SDPA), and
`cpu_block_attention`'s choice between them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import Tensor

from openinfer.engine_core.models.block_attention import (
    BlockContext,
    cpu_block_attention,
    torch_block_attention,
)
from openinfer.kernels.cpu_attention import block_attention_in_place
from tests.kernels.draft_blocks import HEADS, PAGE, REQUESTS, make_blocks


def with_host_tables(context: BlockContext, extra_pages: int = 1) -> BlockContext:
    """``context`` with its tables on the host too, each cut to the pages its context uses and
    ``extra_pages`` more where the table has them (as a request's table holds pages for the positions it is
    about to verify: keys there are masked on the device)."""
    tables = context.block_tables.tolist()
    used = [-(-c // PAGE) + extra_pages for c in context.context_lens.tolist()]
    return replace(context, host_tables=[t[:n] for t, n in zip(tables, used, strict=True)])


def in_place(
    q: Tensor, k: Tensor, v: Tensor, cache: Tensor, context: BlockContext, scale: float, extra_pages: int = 1
) -> Tensor:
    runs, limits = with_host_tables(context, extra_pages).host_runs
    return block_attention_in_place(
        q, k, v, cache, context.block_tables, runs, limits, context.context_lens, context.block_lens, scale
    )


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa4"])
def test_cpu_block_attention_matches_torch(heads: tuple[int, int], head_dim: int) -> None:
    """Ragged contexts (0 included: the block alone) over shuffled pages and ragged block lengths agree with
    the reference at every slot, padding slots' queries included."""
    blocks = make_blocks(REQUESTS, heads, head_dim, torch.float32)
    scale = head_dim**-0.5
    expected = torch_block_attention(blocks.q, blocks.k, blocks.v, blocks.cache, blocks.context, scale)
    out = in_place(blocks.q, blocks.k, blocks.v, blocks.cache, blocks.context, scale)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # five small contexts: their padded copy is small, so the CPU path takes it (the same numbers)
    chosen = cpu_block_attention(blocks.q, blocks.k, blocks.v, blocks.cache, blocks.context, scale)
    torch.testing.assert_close(chosen, expected, atol=1e-5, rtol=1e-5)


def test_cpu_block_attention_views_and_gathered_pieces() -> None:
    """A 70-token context whose pages are a run of 5 (read as a view), 2 stray pages (gathered) and a run of
    11 (a view, cut at the context's end), and a second request on stray pages only: the pieces' online
    softmax equals one softmax over the gathered copy; pages outside the tables hold NaN and are never read."""
    g = torch.Generator().manual_seed(3)
    num_heads, num_kv_heads, head_dim, width = 8, 2, 64, 5
    pages = [*range(20, 25), 3, 9, *range(30, 41)]  # 18 pages = 72 slots for 70 context tokens
    stray = [5, 1, 12, 7]  # 14 tokens over 4 pages, none consecutive
    cache = torch.full((2, 48, PAGE, num_kv_heads, head_dim), float("nan"))
    for page in pages + stray:
        cache[:, page] = torch.randn(2, PAGE, num_kv_heads, head_dim, generator=g)
    tables = torch.tensor([pages, stray + [0] * (len(pages) - len(stray))], dtype=torch.int32)
    context = BlockContext(
        block_tables=tables,
        context_lens=torch.tensor([70, 14]),
        block_lens=torch.tensor([5, 2]),
        max_context_len=70,
        page_size=PAGE,
        block_width=width,
    )
    q = torch.randn(2, width, num_heads, head_dim, generator=g)
    k, v = torch.randn(2, 2, width, num_kv_heads, head_dim, generator=g)
    # the reference gathers every table column up to 70 tokens: give it a cache without NaN in them
    clean = torch.nan_to_num(cache)
    expected = torch_block_attention(q, k, v, clean, context, head_dim**-0.5)
    out = in_place(q, k, v, cache, context, head_dim**-0.5, extra_pages=0)  # no page past the contexts
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_cpu_block_attention_reads_a_lone_block_in_place() -> None:
    """With its tables on the host, one block reads its context in place whatever its length: pages past its
    host table hold NaN, which the padded gather would read at the table's padding columns; without host
    tables (the device's graphs) it takes the padded gather."""
    g = torch.Generator().manual_seed(4)
    cache = torch.randn(2, 8, PAGE, 2, 64, generator=g)
    cache[:, 5:] = float("nan")
    context = BlockContext(
        block_tables=torch.tensor([[0, 1, 2, 5]]),  # page 5 lies past the 10-token context and its next page
        context_lens=torch.tensor([10]),
        block_lens=torch.tensor([3]),
        max_context_len=16,  # the padded gather reads page 5 whole
        page_size=PAGE,
        block_width=3,
        host_tables=[[0, 1, 2]],
    )
    q = torch.randn(1, 3, 4, 64, generator=g)
    k, v = torch.randn(2, 1, 3, 2, 64, generator=g)
    out = cpu_block_attention(q, k, v, cache, context, 0.125)
    assert not out.isnan().any()
    expected = torch_block_attention(q, k, v, torch.nan_to_num(cache), context, 0.125)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert cpu_block_attention(q, k, v, cache, replace(context, host_tables=None), 0.125).isnan().any()
