"""The flash-attn backend agrees with the torch backend (CUDA + flash-attn only)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from openinfer.kernels.attention import TorchAttentionBackend
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.kernel_backends import select_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None,
        reason="needs CUDA and flash-attn",
    ),
]

BLOCK_SIZE = 256  # flash-attn's paged KV needs a multiple of 256
NUM_BLOCKS = 8
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 8, 2, 128
# (context_len, query_len): a prefill, decodes, a chunk after a context, a request over 2 blocks of 256
REQUESTS = [(0, 37), (50, 1), (100, 20), (15, 1), (0, 1), (300, 8)]


def test_flash_matches_torch_backend() -> None:
    """Same paged cache, same mixed batch: flash-attn, reading the cache through the block table, gives the
    torch backend's output (bf16 tolerance), and both leave the same cache behind."""
    from openinfer.kernels.flash_attention import FlashAttentionBackend

    assert isinstance(select_backend(torch.device("cuda"), "flash_attn", BLOCK_SIZE), FlashAttentionBackend)
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    pool = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(1)).tolist()
    tables = []
    for context, query in REQUESTS:
        n = -(-(context + query) // BLOCK_SIZE)
        tables.append(pool[:n])
        pool = pool[n:]
    meta = AttentionMetadata.build(
        [c for c, _ in REQUESTS], [q for _, q in REQUESTS], tables, BLOCK_SIZE, device
    )
    num_tokens = meta.num_tokens
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=g, device=device)
    cache = cache.to(torch.bfloat16)  # stands in for the contexts earlier steps cached
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
    v = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)

    torch_cache, flash_cache = cache.clone(), cache.clone()
    expected = TorchAttentionBackend(reads_in_place=False).forward(q, k, v, torch_cache, meta, HEAD_DIM**-0.5)
    out = FlashAttentionBackend(BLOCK_SIZE).forward(q, k, v, flash_cache, meta, HEAD_DIM**-0.5)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    assert torch.equal(torch_cache, flash_cache)
