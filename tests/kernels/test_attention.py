"""The torch paged-attention backend against a naive per-request reference."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from openinfer.kernels.attention import TorchAttentionBackend
from openinfer.kernels.attention_backend import write_kv_cache
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.backend_name import BackendName
from openinfer.kernels.flash_attention import FlashAttentionBackend
from openinfer.kernels.kernel_backends import select_backend

BLOCK_SIZE = 4
NUM_BLOCKS = 32
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 8
# (context_len, query_len) per request: a fresh prefill, a decode, a chunk after a context, a long prefill
# crossing several blocks, a decode at a block boundary (8 = 2 full blocks already cached).
REQUESTS = [(0, 5), (7, 1), (12, 4), (3, 9), (8, 1)]
# The backend's shortcuts: decodes over unequal contexts (no query padding, a key mask), decodes over equal
# contexts (no mask at all), one prefill chunk after a context (no query padding, a causal mask).
DECODES = [(7, 1), (12, 1), (0, 1), (8, 1)]
EQUAL_DECODES = [(9, 1), (9, 1), (9, 1)]
ONE_CHUNK = [(6, 7)]


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


@pytest.mark.parametrize(
    "requests",
    [REQUESTS, DECODES, EQUAL_DECODES, ONE_CHUNK],
    ids=["mixed", "decodes", "equal-decodes", "one-chunk"],
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_torch_backend_matches_reference(device: str, requests: list[tuple[int, int]]) -> None:
    """Batches on scattered blocks, mixed or taking one of the backend's shortcuts: outputs equal
    per-request causal attention over cached context + new tokens, and the new keys/values land in their
    slots."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(0)
    tables = block_tables_for(requests, seed=1)
    kv_cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device)
    full_k, full_v = [], []
    for (context, query), table in zip(requests, tables, strict=True):
        full_k.append(torch.randn(context + query, NUM_KV_HEADS, HEAD_DIM, generator=g))
        full_v.append(torch.randn(context + query, NUM_KV_HEADS, HEAD_DIM, generator=g))
        if context:  # what earlier steps left in the cache
            prior = AttentionMetadata.build([0], [context], [table], BLOCK_SIZE, torch.device(device))
            write_kv_cache(
                kv_cache, full_k[-1][:context].to(device), full_v[-1][:context].to(device), prior.slot_mapping
            )

    meta = AttentionMetadata.build(
        [c for c, _ in requests], [q for _, q in requests], tables, BLOCK_SIZE, torch.device(device)
    )
    qs = [torch.randn(q, NUM_HEADS, HEAD_DIM, generator=g) for _, q in requests]
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, requests, strict=True)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, requests, strict=True)])
    scale = HEAD_DIM**-0.5
    out = select_backend(torch.device(device), BackendName.TORCH).forward(
        torch.cat(qs).to(device), new_k.to(device), new_v.to(device), kv_cache, meta, scale
    )

    expected = torch.cat(
        [
            reference_attention(q, k, v, context, scale)
            for q, k, v, (context, _) in zip(qs, full_k, full_v, requests, strict=True)
        ]
    )
    assert out.shape == (sum(q for _, q in requests), NUM_HEADS, HEAD_DIM)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)
    for (context, query), table, k, v in zip(requests, tables, full_k, full_v, strict=True):
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
    # (2, 5) grid of keys; request 1's rows past its 1 key read block 7, then padding block 0 (masked)
    assert meta.padded_key_slots.tolist() == [20, 21, 22, 23, 8, 28, 29, 30, 31, 0]
    assert meta.queries_are_padded  # 3 tokens in a (2, 2) grid
    bias = meta.attn_bias
    assert bias is not None and bias.shape == (2, 1, 2, 5)
    assert (bias[:, 0] == 0).tolist() == meta.causal_mask.tolist()


def test_metadata_shortcuts() -> None:
    """Decodes need no query padding; over equal contexts they need no mask either."""
    unequal = AttentionMetadata.build([3, 5], [1, 1], [[1, 2], [3, 4]], 4, torch.device("cpu"))
    assert not unequal.queries_are_padded and unequal.attn_bias is not None
    assert unequal.attn_bias[0, 0, 0].tolist() == [0.0] * 4 + [float("-inf")] * 2  # 4 keys of 6
    equal = AttentionMetadata.build([5, 5], [1, 1], [[1, 2], [3, 4]], 4, torch.device("cpu"))
    assert not equal.queries_are_padded and equal.attn_bias is None


def test_select_backend_on_cpu_is_torch() -> None:
    """auto and torch give the torch backend on the CPU; an unknown name and flash_attn there are refused."""
    cpu = torch.device("cpu")
    assert isinstance(select_backend(cpu), TorchAttentionBackend)
    assert isinstance(select_backend(cpu, "torch"), TorchAttentionBackend)
    with pytest.raises(ValueError, match="must be auto, torch, triton or flash_attn"):
        select_backend(cpu, "xformers")
    with pytest.raises(ValueError, match="flash_attn needs a CUDA device"):
        select_backend(cpu, "flash_attn", 256)


def test_flash_attn_refuses_small_blocks() -> None:
    """flash-attn's paged KV needs blocks of a multiple of 256 tokens: 16 is refused naming --block-size
    (checked before flash-attn is imported, so this runs anywhere)."""
    with pytest.raises(ValueError, match="--block-size a multiple of 256"):
        FlashAttentionBackend(16)
