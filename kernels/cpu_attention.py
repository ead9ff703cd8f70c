"""Paged attention on the CPU that reads each request's keys and values where the cache holds them.

The padded reference (`padded_attention` in attention.py) gathers every request's whole context into a
(B, max_seq_len) batch in every layer of every step, so a decode step copies the whole KV cache it reads.
Here each request attends on its own, over its blocks as runs of consecutive ids (`BlockRun` of
attention_metadata.py: a prompt chunk's blocks are allocated together, a decode adds one block at a time): a
long run is a view of the cache, no copy; short runs are gathered together with `index_select`, a cache-sized
piece at a time.

- A decode or a verification (at most FEW_QUERIES queries) folds its queries and the GQA group into the rows
  of two batched matmuls per KV head, which read the strided views without a copy, piece by piece under an
  online softmax (float32), the causal mask on the pieces past its context.
- A prefill chunk runs `chunk_attention` (cpu_chunk_attention.py: torch's CPU flash kernel or oneDNN
  matmuls, whichever this CPU runs faster) over its whole context, a view when the context is one run, else
  gathered.

Small batches over short contexts still take the padded gather (`in_place_pays`), whose one call beats B
small ones while its copy stays in cache. `benchmarks/cpu_attention.py` measures both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from openinfer.kernels.attention_metadata import BlockRun
from openinfer.kernels.cpu_chunk_attention import chunk_attention

if TYPE_CHECKING:
    from openinfer.kernels.attention_metadata import AttentionMetadata

# Below this many bytes of gathered keys and values a batch's one padded gather and one SDPA beat B
# per-request calls (measured on a 2-core AVX-512 EPYC, float32: the padded copy stays in cache until
# about 8 MiB, then costs 4-5x more per byte; docs/benchmarks.md "CPU attention in place").
PADDED_GATHER_LIMIT = 8 << 20
# Short runs are gathered this many blocks at a time and each piece folded into the online softmax, so what
# is copied is read back while still in cache (one whole-context copy at 4,096 tokens of 8 float32 KV heads
# of 128 is 32 MiB: 4-8x slower than the pieces here; 16-64 blocks measured alike).
GATHER_PIECE_BLOCKS = 32
# A run of at least this many blocks is read as a view; shorter ones are gathered (a 16-token view costs two
# matmul calls for 16 keys, more than copying its 128 KiB of float32 keys and values with its neighbours').
VIEW_MIN_BLOCKS = 4
# Requests with at most this many queries (decodes, verifications of K + 1 tokens) take the piecewise path;
# longer ones (prefill chunks) the flash kernel over their whole context.
FEW_QUERIES = 16


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


def key_pieces(
    kv_cache: Tensor, runs: list[BlockRun], table: Tensor, seq_len: int
) -> Iterator[tuple[int, Tensor]]:
    """The keys and values of positions [0, seq_len) of a request whose block table is ``table`` (its runs
    of consecutive ids ``runs``), in order, as (first position, (2, n, num_kv_heads, head_dim)) pieces: a
    view of the cache for each run of VIEW_MIN_BLOCKS blocks or more, the short runs between them gathered
    GATHER_PIECE_BLOCKS blocks at a time. The last piece ends at position seq_len - 1."""
    two, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    rows = kv_cache.view(two, num_blocks, block_size * num_kv_heads * head_dim)

    def piece(index: int, blocks: Tensor) -> tuple[int, Tensor]:  # blocks (2, n, block_size, ...)
        start = index * block_size
        n = blocks.shape[1] * block_size
        return start, blocks.reshape(two, n, num_kv_heads, head_dim)[:, : seq_len - start]

    def gathered(index: int, stop: int) -> tuple[int, Tensor]:  # table[index:stop], short runs
        return piece(index, rows.index_select(1, table[index:stop].long()))

    pending: int | None = None  # table index where the short runs not yet gathered begin
    for run in runs:
        if run.length >= VIEW_MIN_BLOCKS:
            if pending is not None:
                yield gathered(pending, run.offset)
                pending = None
            yield piece(run.offset, kv_cache[:, run.first : run.first + run.length])
            continue
        if pending is None:
            pending = run.offset
        if run.offset + run.length - pending >= GATHER_PIECE_BLOCKS:
            yield gathered(pending, run.offset + run.length)
            pending = None
    if pending is not None:
        yield gathered(pending, runs[-1].offset + runs[-1].length)


def request_pieces(kv_cache: Tensor, meta: AttentionMetadata, b: int) -> list[tuple[int, Tensor]]:
    """`key_pieces` of request b of a step: its context and the step's new keys."""
    assert meta.block_runs is not None, "CPU attention metadata finds its block runs"
    seq_len = meta.context_lens[b] + meta.query_lens[b]
    return list(key_pieces(kv_cache, meta.block_runs[b], meta.block_tables[b], seq_len))


def request_kv(kv_cache: Tensor, meta: AttentionMetadata, b: int) -> Tensor:
    """(2, seq_len, num_kv_heads, head_dim): request b's keys and values, a view of the cache when its
    blocks are one run, else a copy of its blocks."""
    pieces = [kv for _, kv in request_pieces(kv_cache, meta, b)]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


# (first position, number of keys) of a piece -> the keys hidden from each query ((Q, n), or (n,) for all of
# them), or None: all seen
HiddenKeys = Callable[[int, int], Tensor | None]


def piece_attention(q: Tensor, pieces: list[tuple[int, Tensor]], scale: float, hidden: HiddenKeys) -> Tensor:
    """Q queries (q (Q, num_heads, head_dim)) over keys and values given in pieces ((first position,
    (2, n, num_kv_heads, head_dim)), at least one), under an online softmax in float32 -> (Q, num_heads,
    head_dim). The G query heads sharing a KV head and the Q queries are the rows of one matmul per KV head:
    nothing is repeated, strided views are read without a copy. Every query must see a key of the first
    piece."""
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = pieces[0][1].shape[2]
    group = num_heads // num_kv_heads
    rows = group * num_queries
    # (Q, H, D) -> (Hkv, G * Q, D): row g * Q + i is query i of head kv * G + g
    grouped = (
        q.view(num_queries, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(-1, rows, head_dim)
    )

    def scores_of(start: int, keys: Tensor) -> Tensor:  # keys (n, Hkv, D) at positions start.. -> float32
        n = keys.shape[0]
        scores = torch.bmm(grouped, keys.permute(1, 2, 0)).float().mul_(scale)  # (Hkv, G * Q, n)
        mask = hidden(start, n)  # (Q, n) or None
        if mask is not None:
            scores.view(num_kv_heads, group, num_queries, n).masked_fill_(mask, float("-inf"))
        return scores

    def heads_out(out: Tensor) -> Tensor:  # (Hkv, G * Q, D) -> (Q, H, D)
        return out.view(num_kv_heads, group, num_queries, head_dim).permute(2, 0, 1, 3).reshape(q.shape)

    if len(pieces) == 1:  # one softmax, no running statistics
        keys, values = pieces[0][1].unbind(0)  # (S, Hkv, D) each
        probs = scores_of(pieces[0][0], keys).softmax(-1).to(q.dtype)  # (Hkv, G * Q, S)
        return heads_out(torch.bmm(probs, values.transpose(0, 1)))
    running_max = torch.full((num_kv_heads, rows, 1), float("-inf"))  # (Hkv, G * Q, 1) float32
    denominator = torch.zeros_like(running_max)  # (Hkv, G * Q, 1)
    acc = torch.zeros(num_kv_heads, rows, head_dim)  # (Hkv, G * Q, D) float32
    for start, kv in pieces:
        keys, values = kv.unbind(0)  # (n, Hkv, D) each
        scores = scores_of(start, keys)
        # every query sees a key of the first piece: the running max is finite from then on
        new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
        probs = scores.sub_(new_max).exp_()  # (Hkv, G * Q, n)
        rescale = (running_max - new_max).exp_()  # exp(-inf) = 0 on the first piece
        denominator.mul_(rescale).add_(probs.sum(-1, keepdim=True))
        acc.mul_(rescale).add_(torch.bmm(probs.to(q.dtype), values.transpose(0, 1)).float())
        running_max = new_max
    return heads_out(acc.div_(denominator).to(q.dtype))


def few_query_attention(q: Tensor, kv_cache: Tensor, meta: AttentionMetadata, b: int, scale: float) -> Tensor:
    """Request b's Q queries at positions context_len.. (q (Q, num_heads, head_dim), causal) over its keys
    (`request_pieces`, `piece_attention`) -> (Q, num_heads, head_dim)."""
    num_queries = q.shape[0]
    context_len = meta.context_lens[b]
    query_pos = torch.arange(context_len, context_len + num_queries)[:, None]  # (Q, 1)

    def causal(start: int, n: int) -> Tensor | None:  # keys past the first query's position: hide them
        if start + n - 1 <= context_len:
            return None
        return torch.arange(start, start + n)[None, :] > query_pos  # (Q, n)

    return piece_attention(q, request_pieces(kv_cache, meta, b), scale, causal)


def block_attention_in_place(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cache: Tensor,
    block_tables: Tensor,
    block_runs: list[list[BlockRun]],
    key_limits: list[int],
    context_lens: Tensor,
    block_lens: Tensor,
    scale: float,
) -> Tensor:
    """Non-causal draft-block attention (DFlash, DSpark) reading the context where the cache holds it: block
    b's queries q[b] (B, T, num_heads, head_dim) see its own first block_lens[b] keys and values of k[b],
    v[b] (B, T, num_kv_heads, head_dim), then its context positions [0, context_lens[b]) in ``cache`` ((2,
    num_pages, page_size, num_kv_heads, head_dim); its pages ``block_tables[b]``, in runs of consecutive ids
    ``block_runs[b]`` holding key_limits[b] positions) -> (B, T, num_heads, head_dim). Lengths stay on the
    device (keys past them are masked, nothing is read back); padding queries are computed like the others.
    The block's own slot 0 (block_lens >= 1) is seen by every query, so its piece comes first."""
    out = torch.empty_like(q)
    slots = torch.arange(k.shape[1], device=k.device)  # (T,)
    for b, (runs, limit) in enumerate(zip(block_runs, key_limits, strict=True)):
        hidden = partial(_block_keys_hidden, slots >= block_lens[b], context_lens[b])
        pieces = [(-1, torch.stack((k[b], v[b])))]  # (2, T, Hkv, D): the block's own keys first
        pieces += key_pieces(cache, runs, block_tables[b], limit) if limit else []
        out[b] = piece_attention(q[b], pieces, scale, hidden)
    return out


def _block_keys_hidden(block_padding: Tensor, context_len: Tensor, start: int, n: int) -> Tensor:
    """(n,) bool: a draft block's padding slots (its own piece, ``start`` -1), or context positions at or
    past its length (0-d, on the device)."""
    if start < 0:
        return block_padding
    return torch.arange(start, start + n, device=block_padding.device) >= context_len


def in_place_attention(q: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float) -> Tensor:
    """Each request's queries (packed, q (num_tokens, num_heads, head_dim)) against its own context in
    `kv_cache` (its new keys already written) -> (num_tokens, num_heads, head_dim) in q's dtype."""
    out = torch.empty_like(q)
    start = 0
    for b, (context_len, query_len) in enumerate(zip(meta.context_lens, meta.query_lens, strict=True)):
        queries = q[start : start + query_len]
        if query_len <= FEW_QUERIES:
            out[start : start + query_len] = few_query_attention(queries, kv_cache, meta, b, scale)
        else:
            keys, values = request_kv(kv_cache, meta, b).unbind(0)  # (S, Hkv, D) each
            out[start : start + query_len] = chunk_attention(queries, keys, values, context_len, scale)
        start += query_len
    return out
