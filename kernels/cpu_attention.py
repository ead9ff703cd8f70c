"""Paged attention on the CPU that reads each request's keys and values where the cache holds them.

The padded reference (`padded_attention` in attention.py) gathers every request's whole context into a
(B, max_seq_len) batch in every layer of every step, so a decode step copies the whole KV cache it reads.
Here each request attends on its own: when its blocks have consecutive ids (a prompt's blocks are allocated
together) its keys and values are a view of the cache, no copy at all; otherwise one `index_select` of its
whole blocks (block-sized rows, no padding to the batch's longest context). A decode folds the GQA group
into the query axis and runs two batched matmuls over the KV heads, which read strided views without a
copy; a prefill chunk or a verification (query length > 1) runs `scaled_dot_product_attention` with its
causal mask. `benchmarks/cpu_attention.py` measures both paths against the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from openinfer.kernels.attention import AttentionMetadata


def request_kv(kv_cache: Tensor, meta: AttentionMetadata, b: int) -> Tensor:
    """(2, seq_lens[b], num_kv_heads, head_dim): request b's keys and values, a view of the cache when its
    blocks are consecutive, else a copy of its blocks only."""
    two, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    seq_len = meta.context_lens[b] + meta.query_lens[b]
    n = -(-seq_len // block_size)  # blocks holding the request's keys
    first = meta.first_blocks[b]
    if first is not None:
        blocks = kv_cache[:, first : first + n]  # (2, n, block_size, num_kv_heads, head_dim) view
    else:
        rows = kv_cache.view(two, num_blocks, block_size * num_kv_heads * head_dim)
        blocks = rows.index_select(1, meta.block_tables[b, :n].long())
    return blocks.reshape(two, n * block_size, num_kv_heads, head_dim)[:, :seq_len]


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
    """One query token: q (num_heads, head_dim) over keys/values (S, num_kv_heads, head_dim) -> (num_heads,
    head_dim). The G query heads sharing a KV head are its G query rows, so nothing is repeated."""
    num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    grouped = q.view(num_kv_heads, num_heads // num_kv_heads, head_dim)  # (Hkv, G, D)
    scores = torch.bmm(grouped, keys.permute(1, 2, 0)).mul_(scale)  # (Hkv, G, S): strided reads, no copy
    probs = scores.float().softmax(-1).to(q.dtype)
    return torch.bmm(probs, values.transpose(0, 1)).view(num_heads, head_dim)  # (Hkv, G, D) -> (H, D)


def chunk_attention(q: Tensor, keys: Tensor, values: Tensor, context_len: int, scale: float) -> Tensor:
    """Q query tokens at positions context_len.. : q (Q, num_heads, head_dim) over keys/values
    (context_len + Q, num_kv_heads, head_dim), causal within the chunk -> (Q, num_heads, head_dim)."""
    num_queries, num_heads, _ = q.shape
    seq_len = keys.shape[0]
    if context_len == 0:
        mask = None  # a fresh prompt: plain causal
    else:  # query i sits at position context_len + i and sees keys 0..context_len + i
        query_pos = torch.arange(context_len, seq_len)[:, None]  # (Q, 1)
        mask = torch.arange(seq_len)[None, :] <= query_pos  # (Q, S) bool
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),  # (H, Q, D)
        keys.transpose(0, 1),  # (Hkv, S, D) view
        values.transpose(0, 1),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=num_heads != keys.shape[1],
    )  # (H, Q, D)
    return out.transpose(0, 1)


def in_place_attention(q: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float) -> Tensor:
    """Each request's queries (packed, q (num_tokens, num_heads, head_dim)) against its own context in
    `kv_cache` (its new keys already written) -> (num_tokens, num_heads, head_dim) in q's dtype."""
    out = torch.empty_like(q)
    start = 0
    for b, (context_len, query_len) in enumerate(zip(meta.context_lens, meta.query_lens, strict=True)):
        keys, values = request_kv(kv_cache, meta, b).unbind(0)  # (S, num_kv_heads, head_dim) each
        if query_len == 1:
            out[start] = decode_attention(q[start], keys, values, scale)
        else:
            out[start : start + query_len] = chunk_attention(
                q[start : start + query_len], keys, values, context_len, scale
            )
        start += query_len
    return out
