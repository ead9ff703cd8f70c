"""Draft-block attention (DFlash, DSpark): where each block's context lies in the paged context cache
(`BlockContext`), and the attention over it, one implementation per device path: the torch reference (a
gathered copy and one SDPA), the CPU's in-place read (kernels/cpu_attention.py) and the Triton kernel.
`follow_backend` picks the one matching the target's attention backend."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from openinfer.kernels.attention_backend import AttentionBackend
from openinfer.kernels.attention_metadata import BlockRun, find_block_runs
from openinfer.kernels.backend_name import BackendName
from openinfer.kernels.cpu_attention import PADDED_GATHER_LIMIT, block_attention_in_place


@dataclass(frozen=True)
class BlockContext:
    """Where each draft block's context keys/values lie in the paged context cache, and which keys are real.

    The cache has the target's layout, one tensor per draft layer: (2, num_pages, page_size, num_kv_heads,
    head_dim); position p of block b's request is at page block_tables[b, p // page_size], offset
    p % page_size. Block b sees context positions [0, context_lens[b]) and the first block_lens[b] of its
    block_width keys (the rest are padding).
    """

    block_tables: Tensor  # (B, width) int32/int64: columns past a request's context are never attended to
    context_lens: Tensor  # (B,) int
    block_lens: Tensor  # (B,) int, 1..block_width (the Triton kernel takes 0 too: zeros, not NaN)
    max_context_len: int  # context keys the torch path gathers per block: >= every context_lens[b]
    page_size: int
    block_width: int  # T, the block's padded width
    # each block's pages as the host has them (unpadded): the CPU's in-place path walks their runs without
    # reading the device; None: unknown to the host (that path is not taken)
    host_tables: list[list[int]] | None = None

    def gather(self, cache: Tensor) -> tuple[Tensor, Tensor]:
        """The padded context keys and values, each (B, max_context_len, num_kv_heads, head_dim)."""
        num_pages = -(-self.max_context_len // self.page_size)
        tables = self.block_tables[:, :num_pages]  # (B, num_pages)
        keys = cache[0][tables].flatten(1, 2)[:, : self.max_context_len]
        values = cache[1][tables].flatten(1, 2)[:, : self.max_context_len]
        return keys, values

    @cached_property
    def key_mask(self) -> Tensor:
        """(B, max_context_len + block_width) bool: the real context keys, then the real block keys."""
        device = self.context_lens.device
        context = torch.arange(self.max_context_len, device=device)[None, :] < self.context_lens[:, None]
        block = torch.arange(self.block_width, device=device)[None, :] < self.block_lens[:, None]
        return torch.cat((context, block), dim=1)

    @cached_property
    def host_runs(self) -> tuple[list[list[BlockRun]], list[int]]:
        """Each block's runs of consecutive pages in ``host_tables`` and the positions they hold (an upper
        bound of its context: the rest are masked on the device), computed on the host."""
        assert self.host_tables is not None, "the host tables are needed to walk their runs"
        width = max(len(t) for t in self.host_tables)
        tables = np.array([t + [0] * (width - len(t)) for t in self.host_tables], dtype=np.int64)
        limits = [len(t) * self.page_size for t in self.host_tables]
        return find_block_runs(tables, np.array(limits, dtype=np.int64), self.page_size), limits


class BlockAttention(Protocol):
    """Non-causal DFlash block attention: q (B, T, heads, head_dim) over each block's context in `cache` and
    its own k/v (B, T, kv_heads, head_dim), as `context` says; returns (B, T, heads, head_dim)."""

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, cache: Tensor, context: BlockContext, scale: float
    ) -> Tensor: ...


def torch_block_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: Tensor, context: BlockContext, scale: float
) -> Tensor:
    """The CPU path and the reference: the context gathered into a padded copy, then one SDPA."""
    context_k, context_v = context.gather(cache)  # (B, S, kv_heads, head_dim) each
    keys = torch.cat((context_k, k), dim=1)  # (B, S + T, kv_heads, head_dim)
    values = torch.cat((context_v, v), dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),  # (B, heads, T, head_dim)
        keys.transpose(1, 2),  # (B, kv_heads, S + T, head_dim)
        values.transpose(1, 2),
        attn_mask=context.key_mask[:, None, None, :],  # (B, 1, 1, S + T): no causal part
        scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
    )  # (B, heads, T, head_dim)
    return out.transpose(1, 2)


def cpu_block_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: Tensor, context: BlockContext, scale: float
) -> Tensor:
    """The CPU path: each block's context read in place (views of the cache's runs of pages, no copy of the
    whole context), its own keys last, under one online softmax (kernels/cpu_attention.py); a batch whose
    padded copy of the context stays small takes the padded gather and one SDPA instead (as the target's
    attention does: its one call beats B small ones while the copy stays in cache)."""
    _, _, _, num_kv_heads, head_dim = cache.shape
    batch = q.shape[0]
    padded_bytes = 2 * batch * context.max_context_len * num_kv_heads * head_dim * cache.element_size()
    if context.host_tables is None or (batch > 1 and padded_bytes <= PADDED_GATHER_LIMIT):
        return torch_block_attention(q, k, v, cache, context, scale)
    runs, limits = context.host_runs
    return block_attention_in_place(
        q, k, v, cache, context.block_tables, runs, limits, context.context_lens, context.block_lens, scale
    )


def triton_block_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: Tensor, context: BlockContext, scale: float
) -> Tensor:
    """The Triton kernel: the context read in place through the block table (capturable in CUDA graphs)."""
    from openinfer.kernels.triton_dflash_attention import block_attention_triton

    return block_attention_triton(
        q, k, v, cache, context.block_tables, context.context_lens, context.block_lens, scale
    )


def follow_backend(backend: AttentionBackend, device: torch.device) -> BlockAttention:
    """The draft attention matching the target's backend: the Triton kernel when the target runs Triton's,
    on the CPU the context read in place, else torch's SDPA over a gathered copy (flash-attn has no block
    kernel here)."""
    if backend.name is BackendName.TRITON:
        return triton_block_attention
    return cpu_block_attention if device.type == "cpu" else torch_block_attention
