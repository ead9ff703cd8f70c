"""Paged attention on the CPU that reads each request's keys and values where the cache holds them.

The padded reference (`padded_attention` in attention.py) gathers every request's whole context into a
(B, max_seq_len) batch in every layer of every step, so a decode step copies the whole KV cache it reads.
Here each request attends on its own: when its blocks have consecutive ids (a prompt's blocks are allocated
together) its keys and values are a view of the cache, no copy at all; otherwise `index_select`s of its
whole blocks (block-sized rows, no padding to the batch's longest context): a long decode takes them a
cache-sized piece at a time under an online softmax, so nothing it copies leaves the cache. A decode folds the GQA group
into the query axis and runs two batched matmuls over the KV heads, which read strided views without a
copy; a prefill chunk or a verification (query length > 1) runs `scaled_dot_product_attention` with its
causal mask. Small batches over short contexts still take the padded gather (`in_place_pays`), whose
one call beats B small ones while its copy stays in cache. `benchmarks/cpu_attention.py` measures both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from openinfer.kernels.attention import AttentionMetadata

# Below this many bytes of gathered keys and values a batch's one padded gather and one SDPA beat B
# per-request calls (measured on a 2-core AVX-512 EPYC, float32: the padded copy stays in cache until
# about 8 MiB, then costs 4-5x more per byte; docs/benchmarks.md "CPU attention in place").
PADDED_GATHER_LIMIT = 8 << 20
# A decode over scattered blocks gathers this many blocks at a time and folds each piece into an online
# softmax, so what it copies is read back while still in cache (one whole-context copy at 4,096 tokens of
# 8 float32 KV heads of 128 is 32 MiB: 4-8x slower than the pieces here; 16-64 blocks measured alike).
DECODE_PIECE_BLOCKS = 32


def in_place_pays(kv_cache: Tensor, meta: AttentionMetadata) -> bool:
    """Whether `in_place_attention` beats the padded gather for this step: a lone request always does, and
    so does a batch whose query lengths differ (a prefill chunk beside decodes: the padded path would run
    every request at the longest query length; 512 + 7 decodes over 100 tokens: 29 against 273 ms); a
    batch of equal query lengths does once the padded copy of its keys and values would pass
    PADDED_GATHER_LIMIT bytes."""
    num_reqs = len(meta.query_lens)
    if num_reqs == 1 or meta.queries_are_padded:
        return True
    _, _, _, num_kv_heads, head_dim = kv_cache.shape
    gathered = 2 * num_reqs * meta.max_seq_len * num_kv_heads * head_dim * kv_cache.element_size()
    return gathered > PADDED_GATHER_LIMIT


def request_kv(kv_cache: Tensor, meta: AttentionMetadata, b: int, start: int, stop: int) -> Tensor:
    """(2, stop - start, num_kv_heads, head_dim): request b's keys and values at positions start..stop-1
    (start a multiple of the block size), a view of the cache when its blocks are consecutive, else a copy
    of those blocks only."""
    two, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    first_block, end_block = start // block_size, -(-stop // block_size)
    first = meta.first_blocks[b]
    if first is not None:
        blocks = kv_cache[:, first + first_block : first + end_block]  # (2, n, block_size, Hkv, D) view
    else:
        rows = kv_cache.view(two, num_blocks, block_size * num_kv_heads * head_dim)
        blocks = rows.index_select(1, meta.block_tables[b, first_block:end_block].long())
    n = end_block - first_block
    return blocks.reshape(two, n * block_size, num_kv_heads, head_dim)[:, : stop - start]


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
    """One query token: q (num_heads, head_dim) over keys/values (S, num_kv_heads, head_dim) -> (num_heads,
    head_dim). The G query heads sharing a KV head are its G query rows, so nothing is repeated."""
    num_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    grouped = q.view(num_kv_heads, num_heads // num_kv_heads, head_dim)  # (Hkv, G, D)
    scores = torch.bmm(grouped, keys.permute(1, 2, 0)).mul_(scale)  # (Hkv, G, S): strided reads, no copy
    probs = scores.float().softmax(-1).to(q.dtype)
    return torch.bmm(probs, values.transpose(0, 1)).view(num_heads, head_dim)  # (Hkv, G, D) -> (H, D)


def pieced_decode_attention(
    q: Tensor, kv_cache: Tensor, meta: AttentionMetadata, b: int, scale: float
) -> Tensor:
    """`decode_attention` for request b over its scattered blocks, DECODE_PIECE_BLOCKS at a time: each
    piece's scores fold into a running max, denominator and weighted sum (the online softmax), in float32."""
    num_heads, head_dim = q.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    grouped = q.view(num_kv_heads, num_heads // num_kv_heads, head_dim)  # (Hkv, G, D)
    seq_len = meta.context_lens[b] + 1
    piece = DECODE_PIECE_BLOCKS * block_size
    running_max = torch.full((*grouped.shape[:2], 1), float("-inf"))  # (Hkv, G, 1) float32
    denominator = torch.zeros_like(running_max)  # (Hkv, G, 1)
    acc = torch.zeros(grouped.shape, dtype=torch.float32)  # (Hkv, G, D)
    for start in range(0, seq_len, piece):
        keys, values = request_kv(kv_cache, meta, b, start, min(start + piece, seq_len)).unbind(0)
        scores = torch.bmm(grouped, keys.permute(1, 2, 0)).float().mul_(scale)  # (Hkv, G, P)
        new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
        probs = scores.sub_(new_max).exp_()  # (Hkv, G, P)
        rescale = (running_max - new_max).exp_()  # exp(-inf) = 0 on the first piece
        denominator.mul_(rescale).add_(probs.sum(-1, keepdim=True))
        acc.mul_(rescale).add_(torch.bmm(probs.to(q.dtype), values.transpose(0, 1)).float())
        running_max = new_max
    return acc.div_(denominator).to(q.dtype).view(num_heads, head_dim)


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
    # 4-D, batch 1: torch's CPU flash-attention kernel takes only 4-D inputs; 3-D ones fall back to the math
    # path, which materializes the (H, Q, S) scores (2x slower on a 512-token chunk over 1,500 keys).
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],  # (1, H, Q, D)
        keys.transpose(0, 1)[None],  # (1, Hkv, S, D) view
        values.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=num_heads != keys.shape[1],
    )  # (1, H, Q, D)
    return out[0].transpose(0, 1)


def in_place_attention(q: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float) -> Tensor:
    """Each request's queries (packed, q (num_tokens, num_heads, head_dim)) against its own context in
    `kv_cache` (its new keys already written) -> (num_tokens, num_heads, head_dim) in q's dtype."""
    out = torch.empty_like(q)
    start = 0
    piece = DECODE_PIECE_BLOCKS * kv_cache.shape[2]
    for b, (context_len, query_len) in enumerate(zip(meta.context_lens, meta.query_lens, strict=True)):
        seq_len = context_len + query_len
        if query_len == 1 and meta.first_blocks[b] is None and seq_len > piece:
            out[start] = pieced_decode_attention(q[start], kv_cache, meta, b, scale)
            start += 1
            continue
        keys, values = request_kv(kv_cache, meta, b, 0, seq_len).unbind(0)  # (S, Hkv, D) each
        if query_len == 1:
            out[start] = decode_attention(q[start], keys, values, scale)
        else:
            out[start : start + query_len] = chunk_attention(
                q[start : start + query_len], keys, values, context_len, scale
            )
        start += query_len
    return out
