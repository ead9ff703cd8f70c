"""The torch paged-attention backend against a naive per-request reference."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from openinfer.kernels.attention import (
    AttentionMetadata,
    TorchAttentionBackend,
    select_backend,
    write_kv_cache,
)

BLOCK_SIZE = 4
NUM_BLOCKS = 32
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 8
# (context_len, query_len) per request: a fresh prefill, a decode, a chunk after a context, a long prefill
# crossing several blocks, a decode at a block boundary (8 = 2 full blocks already cached).
REQUESTS = [(0, 5), (7, 1), (12, 4), (3, 9), (8, 1)]


def block_tables_for(requests: list[tuple[int, int]], seed: int) -> list[list[int]]:
    """Non-contiguous, out-of-order block ids: each request takes the next blocks of a shuffled pool."""
    pool = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed)).tolist()
    tables = []
    for context, query in requests:
        num_blocks = -(-(context + query) // BLOCK_SIZE)
        tables.append(pool[:num_blocks])
        pool = pool[num_blocks:]
    return tables


def reference_attention(q: Tensor, keys: Tensor, values: Tensor, context: int, scale: float) -> Tensor:
    """One request: q (Q, H, D) at positions context..context+Q-1 over keys/values (context+Q, Hkv, D)."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)  # (S, H, D)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, keys) * scale  # (H, Q, S)
    query_pos = torch.arange(q.shape[0])[:, None] + context
    scores = scores.masked_fill(torch.arange(keys.shape[0])[None, :] > query_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)  # (Q, H, D)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_torch_backend_matches_reference(device: str) -> None:
    """Mixed prefill/decode batch on scattered blocks: outputs equal per-request causal attention over
    cached context + new tokens, and the new keys/values land in their slots."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(0)
    tables = block_tables_for(REQUESTS, seed=1)
    kv_cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device)
    full_k, full_v = [], []
    for (context, query), table in zip(REQUESTS, tables, strict=True):
        full_k.append(torch.randn(context + query, NUM_KV_HEADS, HEAD_DIM, generator=g))
        full_v.append(torch.randn(context + query, NUM_KV_HEADS, HEAD_DIM, generator=g))
        if context:  # what earlier steps left in the cache
            prior = AttentionMetadata.build([0], [context], [table], BLOCK_SIZE, torch.device(device))
            write_kv_cache(
                kv_cache, full_k[-1][:context].to(device), full_v[-1][:context].to(device), prior.slot_mapping
            )

    meta = AttentionMetadata.build(
        [c for c, _ in REQUESTS], [q for _, q in REQUESTS], tables, BLOCK_SIZE, torch.device(device)
    )
    qs = [torch.randn(q, NUM_HEADS, HEAD_DIM, generator=g) for _, q in REQUESTS]
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, REQUESTS, strict=True)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, REQUESTS, strict=True)])
    scale = HEAD_DIM**-0.5
    out = TorchAttentionBackend().forward(
        torch.cat(qs).to(device), new_k.to(device), new_v.to(device), kv_cache, meta, scale
    )

    expected = torch.cat(
        [
            reference_attention(q, k, v, context, scale)
            for q, k, v, (context, _) in zip(qs, full_k, full_v, REQUESTS, strict=True)
        ]
    )
    assert out.shape == (sum(q for _, q in REQUESTS), NUM_HEADS, HEAD_DIM)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    for (context, query), table, k, v in zip(REQUESTS, tables, full_k, full_v, strict=True):
        for p in range(context + query):
            block, offset = table[p // BLOCK_SIZE], p % BLOCK_SIZE
            assert torch.equal(kv_cache[0, block, offset].cpu(), k[p])
            assert torch.equal(kv_cache[1, block, offset].cpu(), v[p])


def test_metadata_build() -> None:
    """slot = block_table[p // block_size] * block_size + p % block_size for each new token, and the
    per-request fields are the cumulative / summed lengths."""
    meta = AttentionMetadata.build([3, 0], [2, 1], [[5, 2], [7]], 4, torch.device("cpu"))
    assert meta.slot_mapping.tolist() == [5 * 4 + 3, 2 * 4 + 0, 7 * 4 + 0]  # positions 3, 4 | 0
    assert meta.query_start_loc.tolist() == [0, 2, 3]
    assert meta.seq_lens.tolist() == [5, 1]
    assert meta.block_tables.tolist() == [[5, 2], [7, 0]]  # padded with block 0
    assert (meta.max_query_len, meta.max_seq_len, meta.num_tokens) == (2, 5, 3)
    assert meta.padded_query_index.tolist() == [0, 1, 2]  # rows (0, 0), (0, 1), (1, 0) of a (2, 2) grid
    assert meta.cu_seqlens_k.tolist() == [0, 5, 6]
    assert meta.packed_key_slots.tolist() == [20, 21, 22, 23, 8, 28]


def test_select_backend_on_cpu_is_torch() -> None:
    """The CPU always gets the torch backend."""
    assert isinstance(select_backend(torch.device("cpu")), TorchAttentionBackend)
