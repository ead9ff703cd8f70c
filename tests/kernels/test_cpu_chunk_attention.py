"""A prefill chunk's CPU attention: the oneDNN blocks and the flash kernel both equal a float64 softmax
reference, whatever the context before the chunk, the GQA group and a last block shorter than the rest;
which one runs is the probe's answer for large chunks and the flash kernel for small ones."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from openinfer.kernels.cpu_chunk_attention import (
    BLOCK_QUERIES,
    chunk_attention,
    chunk_attention_by_onednn,
    flash_chunk_attention,
    onednn_chunk_attention,
    takes_onednn,
)
from openinfer.kernels.cpu_matmul import cpu_packing_available


def reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, context_len: int, scale: float
) -> torch.Tensor:
    """Causal softmax attention in float64, each query head over its KV head's keys."""
    num_queries, num_heads, _ = q.shape
    group = num_heads // keys.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1).transpose(0, 1) for t in (keys, values))  # (H, S, D)
    scores = q.double().transpose(0, 1) @ k.transpose(1, 2) * scale  # (H, Q, S)
    positions = torch.arange(context_len, context_len + num_queries)[:, None]
    scores.masked_fill_(torch.arange(keys.shape[0])[None, :] > positions, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1)  # (Q, H, D)


@pytest.mark.parametrize("path", [flash_chunk_attention, onednn_chunk_attention], ids=["flash", "onednn"])
@pytest.mark.parametrize(
    ("context_len", "num_queries", "heads"),
    [(0, 40, (4, 4)), (0, BLOCK_QUERIES + 37, (8, 2)), (100, 300, (16, 8)), (700, 33, (6, 3))],
)
def test_paths_equal_the_reference(
    path: Callable[..., torch.Tensor], context_len: int, num_queries: int, heads: tuple[int, int]
) -> None:
    """Every path: each query sees keys 0..its position, no further (a block's own diagonal masked)."""
    if path is onednn_chunk_attention and not cpu_packing_available(torch.float32):
        pytest.skip("no oneDNN in this torch")
    num_heads, num_kv_heads = heads
    generator = torch.Generator().manual_seed(context_len + num_queries)
    q = torch.randn(num_queries, num_heads, 32, generator=generator)
    keys, values = torch.randn(2, context_len + num_queries, num_kv_heads, 32, generator=generator)
    got = path(q, keys, values, context_len, 0.2)
    torch.testing.assert_close(got, reference(q, keys, values, context_len, 0.2).float(), atol=2e-5, rtol=0)


def test_chunk_attention_dispatch() -> None:
    """A small chunk (16 queries) is the flash kernel's bit for bit; a large one is whichever path the
    probe chose, bit for bit."""
    generator = torch.Generator().manual_seed(0)
    for num_queries, context_len in ((16, 0), (200, 300)):
        q = torch.randn(num_queries, 4, 32, generator=generator)
        keys, values = torch.randn(2, context_len + num_queries, 2, 32, generator=generator)
        got = chunk_attention(q, keys, values, context_len, 0.2)
        onednn = num_queries == 200 and chunk_attention_by_onednn(torch.float32)
        assert takes_onednn(num_queries, context_len + num_queries, torch.float32) is onednn
        chosen = onednn_chunk_attention if onednn else flash_chunk_attention
        assert torch.equal(got, chosen(q, keys, values, context_len, 0.2))
