"""Draft-block attention inputs shared by the block-attention kernel tests: random block queries, keys and
values over a noisy paged context cache, with ragged contexts and block lengths."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.engine_core.models.block_attention import BlockContext

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # the output's rounding
HEADS = [(2, 2), (8, 2)]  # (num_heads, num_kv_heads): GQA ratios 1 and 4
# (context_len, block_len) per request, blocks of width 6: an empty context, a one-key block, a context that
# ends on a page boundary (16 = 4 pages of 4), one past a 32-key tile, a full block over a long context.
REQUESTS = [(0, 6), (5, 1), (16, 3), (33, 6), (70, 4)]
PAGE = 4


@dataclass(frozen=True)
class Blocks:
    """One draft layer's inputs: block queries/keys/values and a noisy paged context cache."""

    q: Tensor  # (B, T, num_heads, head_dim)
    k: Tensor  # (B, T, num_kv_heads, head_dim)
    v: Tensor
    cache: Tensor  # (2, num_pages, page_size, num_kv_heads, head_dim)
    context: BlockContext


def make_blocks(
    requests: list[tuple[int, int]],
    heads: tuple[int, int],
    head_dim: int,
    dtype: torch.dtype,
    block_width: int = 6,
    seed: int = 0,
) -> Blocks:
    """Random tensors; each request's pages are the next ones of a shuffled pool (out of order, 2 spare), its
    table row padded with page 0 to the widest."""
    g = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    sizes = [-(-c // PAGE) for c, _ in requests]
    pool = torch.randperm(sum(sizes) + 2, generator=g).tolist()
    width = max(sizes)
    tables = [pool[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(len(sizes))]
    tables = [t + [0] * (width - len(t)) for t in tables]
    b = len(requests)
    # q, k and v as views into one packed projection, strided like the model's
    qkv = torch.randn(b, block_width, num_heads + 2 * num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    q, k, v = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=2)
    cache = torch.randn(2, len(pool), PAGE, num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    context = BlockContext(
        block_tables=torch.tensor(tables, dtype=torch.int32, device=DEVICE).view(b, width),
        context_lens=torch.tensor([c for c, _ in requests], dtype=torch.int32, device=DEVICE),
        block_lens=torch.tensor([n for _, n in requests], dtype=torch.int32, device=DEVICE),
        max_context_len=max(c for c, _ in requests),
        page_size=PAGE,
        block_width=block_width,
    )
    return Blocks(q, k, v, cache, context)
