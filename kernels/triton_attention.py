"""Paged attention in Triton: keys and values are read from the paged KV cache through the block table in
place (never gathered into a packed copy). CUDA; on the CPU under ``TRITON_INTERPRET=1`` (tests).

Three kernels, launched by :class:`TritonAttentionBackend`:

- ``_write_kv_kernel``, grid (num_tokens, num_kv_heads): copies each new token's key and value into its slot.
- ``_paged_attention_kernel``, grid (B, num_kv_heads, num_query_tiles * NUM_SPLITS): one program holds a
  tile of one request's queries times the query heads of one KV head (GQA: each K/V tile it loads serves every
  head of the group), as BLOCK_R rows. It walks keys in tiles of BLOCK_N positions, finds each position's block
  in the request's block-table row, and keeps an online softmax in float32. Causal at the end of the context:
  query i of a request with query_len queries and seq_len keys sees keys 0..seq_len - query_len + i.
  With NUM_SPLITS > 1 (flash-decoding) the keys a tile may see are cut into NUM_SPLITS equal ranges, one per
  program, each writing a partial output and its log-sum-exp;
- ``_combine_splits_kernel``, grid (num_tokens, num_heads), merges those partials.

CUDA-graph friendly: the kernels read seq_lens, query_start_loc, block_tables and slot_mapping from device
tensors and nothing is read back to the host. The grids use B, num_tokens, the head counts, NUM_SPLITS (fixed
per backend) and, for the varlen launch only, ``meta.max_query_len``; the split ranges are computed in the
kernel from seq_lens, so the decode grid does not depend on ``max_seq_len``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.backend_name import BackendName
from openinfer.kernels.triton_launch import KernelLaunch
from openinfer.kernels.triton_tiles import (
    DECODE_ROWS,
    KEYS_PER_TILE,
    LOG2_E,
    VARLEN_ROWS,
    WIDE_MAX_REGISTERS,
    WIDE_STAGES,
    WIDE_WARPS,
    dot_dtype,
    head_dim_p2,
    load_paged_kv,
    online_softmax_start,
    online_softmax_step,
    query_rows,
)


@triton.jit
def _write_kv_kernel(
    k_ptr,  # (num_tokens, num_kv_heads, head_dim)
    v_ptr,
    cache_ptr,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    slot_ptr,  # (num_tokens,) int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kv,
    stride_block,
    stride_slot,
    stride_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token)
    d = tl.arange(0, HEAD_DIM_P2)
    d_ok = d < HEAD_DIM
    key = tl.load(k_ptr + token * stride_kt + head * stride_kh + d, mask=d_ok)
    value = tl.load(v_ptr + token * stride_vt + head * stride_vh + d, mask=d_ok)
    dst = cache_ptr + (slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_slot
    dst += head * stride_head + d
    tl.store(dst, key.to(cache_ptr.dtype.element_ty), mask=d_ok)
    tl.store(dst + stride_kv, value.to(cache_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _paged_attention_kernel(
    out_ptr,  # (num_tokens, num_heads, head_dim) in q's dtype; float32 partials with NUM_SPLITS > 1
    lse_ptr,  # (num_tokens, num_heads, NUM_SPLITS) float32, log2 units; unused with NUM_SPLITS == 1
    q_ptr,  # (num_tokens, num_heads, head_dim)
    cache_ptr,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
    block_tables_ptr,  # (B, max_blocks) int32
    seq_lens_ptr,  # (B,) int32
    query_start_loc_ptr,  # (B + 1,) int32
    scale,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_kv,
    stride_block,
    stride_slot,
    stride_head,
    stride_table,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_P2: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rows per program: BLOCK_R // GROUP_P2 queries x GROUP_P2 heads
    BLOCK_N: tl.constexpr,  # key positions per tile
    BLOCK_SIZE: tl.constexpr,  # tokens per KV block
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # the cache dtype; float32 for bfloat16 under the interpreter (see dot_dtype)
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 (no TF32 rounding), "tf32" (unused) for 16-bit
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS
    QUERIES: tl.constexpr = BLOCK_R // GROUP_P2
    q_start = tl.load(query_start_loc_ptr + req)
    query_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - query_len
    if tile * QUERIES >= query_len:  # a request shorter than max_query_len: nothing left for this tile
        return

    query, head, row_ok = query_rows(
        kv_head, tile * QUERIES, query_len, GROUP, GROUP_P2, BLOCK_R
    )  # (R,) each
    token = (q_start + query).to(tl.int64)  # (R,) packed token index
    d = tl.arange(0, HEAD_DIM_P2)
    d_ok = d < HEAD_DIM
    q_ptrs = q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)  # (R, D)
    query_pos = context_len + query  # (R,) each row's position: it sees keys 0..query_pos

    # Keys any row of this tile sees: [0, kv_end); this split's share: [kv_lo, kv_hi), whole key tiles.
    kv_end = tl.minimum(seq_len, context_len + (tile + 1) * QUERIES)
    split_len = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), BLOCK_N) * BLOCK_N
    kv_lo = split * split_len
    kv_hi = tl.minimum(kv_end, kv_lo + split_len)

    m_i, l_i, acc = online_softmax_start(BLOCK_R, HEAD_DIM_P2)
    table_row = block_tables_ptr + req * stride_table
    for start in range(kv_lo, kv_hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)  # (N,) key positions
        in_range = pos < kv_hi
        k, v = load_paged_kv(
            cache_ptr, table_row, pos, in_range, kv_head, d, d_ok,
            stride_kv, stride_block, stride_slot, stride_head, BLOCK_SIZE, DOT_DTYPE,
        )  # fmt: skip
        visible = in_range[None, :] & (pos[None, :] <= query_pos[:, None])
        m_i, l_i, acc = online_softmax_step(q, k, v, visible, m_i, l_i, acc, scale, DOT_DTYPE, DOT_PRECISION)

    num_heads = GROUP * tl.num_programs(1)
    out_row = token * num_heads + head  # (R,) row of (num_tokens * num_heads)
    out_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:  # every valid row saw key 0 at least: l_i > 0
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + out_row[:, None] * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty), out_mask
        )
    else:  # an empty split leaves l_i == 0: output 0 with log-sum-exp -inf, i.e. no weight in the combine
        safe_l = tl.where(l_i > 0, l_i, 1.0)
        out = acc / safe_l[:, None]
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        partial_row = out_row * NUM_SPLITS + split
        tl.store(out_ptr + partial_row[:, None] * HEAD_DIM + d[None, :], out, out_mask)
        tl.store(lse_ptr + partial_row, lse, row_ok)


@triton.jit
def _combine_splits_kernel(
    out_ptr,  # (num_tokens, num_heads, head_dim)
    partial_ptr,  # (num_tokens, num_heads, NUM_SPLITS, head_dim) float32
    lse_ptr,  # (num_tokens, num_heads, NUM_SPLITS) float32, log2 units
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)  # token * num_heads + head
    splits = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HEAD_DIM_P2)
    d_ok = d < HEAD_DIM
    lse = tl.load(lse_ptr + row * NUM_SPLITS + splits)  # (S,); split 0 always holds key 0, so max is finite
    weight = tl.exp2(lse - tl.max(lse, 0))  # (S,)
    partial_ptrs = partial_ptr + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + d[None, :]
    partial = tl.load(partial_ptrs, mask=d_ok[None, :], other=0.0)  # (S, D)
    out = tl.sum(partial * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + row * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def write_kv_cache_triton(kv_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """`attention.write_kv_cache` as one kernel: k/v (num_tokens, num_kv_heads, head_dim) into their slots."""
    if k.shape[0]:
        write_kv_launch(kv_cache, k, v, slot_mapping).run()


def write_kv_launch(kv_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> KernelLaunch:
    """The launch of `_write_kv_kernel` for num_tokens >= 1 (write_kv_cache_triton and the compile check)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if k.stride(-1) != 1 or v.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("k, v and the KV cache need a contiguous head_dim")
    return KernelLaunch(
        _write_kv_kernel,
        (num_tokens, num_kv_heads),
        (
            k,
            v,
            kv_cache,
            slot_mapping,
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            *kv_cache.stride()[:4],
        ),
        {"BLOCK_SIZE": kv_cache.shape[2], "HEAD_DIM": head_dim, "HEAD_DIM_P2": head_dim_p2(head_dim)},
    )


class TritonAttentionBackend:
    """The AttentionBackend on CUDA: Triton kernels over the paged cache, no per-layer gather.

    Decode steps (``max_query_len == 1``) split every request's keys into ``num_kv_splits`` ranges
    (flash-decoding: long contexts keep the GPU busy at small batch); other steps (prefill chunks, drafts'
    verification) run one program per query tile. Any block size, block-table order and context length;
    GQA with num_heads a multiple of num_kv_heads; float32, float16 and bfloat16 caches, float32 softmax.
    """

    name = BackendName.TRITON
    cuda_graphs = True  # reads the step's tensors on the device; grids use only batch-shaped ints

    def __init__(self, num_kv_splits: int = 8) -> None:
        if num_kv_splits < 1 or num_kv_splits & (num_kv_splits - 1):
            raise ValueError(f"num_kv_splits must be a power of two, got {num_kv_splits}")
        self.num_kv_splits = num_kv_splits

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float
    ) -> Tensor:
        num_heads, num_kv_heads = q.shape[1], kv_cache.shape[3]
        if num_heads % num_kv_heads:
            raise ValueError(f"need num_heads ({num_heads}) a multiple of num_kv_heads ({num_kv_heads})")
        if q.stride(-1) != 1:
            raise ValueError("q needs a contiguous head_dim")
        write_kv_cache_triton(kv_cache, k, v, meta.slot_mapping)
        out, launches = attention_launches(q, kv_cache, meta, scale, self.num_kv_splits)
        for launch in launches:
            launch.run()
        return out


def attention_launches(
    q: Tensor, kv_cache: Tensor, meta: AttentionMetadata, scale: float, num_kv_splits: int
) -> tuple[Tensor, list[KernelLaunch]]:
    """The output (num_tokens, num_heads, head_dim) and the launches that fill it: the paged-attention
    kernel, then with NUM_SPLITS > 1 (decode steps) the combine. Used by the backend and the compile check."""
    num_tokens, num_heads, head_dim = q.shape
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    group = num_heads // num_kv_heads
    group_p2 = triton.next_power_of_2(group)
    decode = meta.max_query_len == 1
    splits = num_kv_splits if decode else 1
    float32 = kv_cache.dtype == torch.float32
    rows = max(DECODE_ROWS if decode or float32 else VARLEN_ROWS, group_p2)
    num_query_tiles = math.ceil(meta.max_query_len / (rows // group_p2))
    num_warps = WIDE_WARPS if float32 or not decode else 4
    num_stages = 3 if decode else 1 if float32 else WIDE_STAGES
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (num_tokens, num_heads, head_dim)
    if splits > 1:
        partial = q.new_empty((num_tokens, num_heads, splits, head_dim), dtype=torch.float32)
        lse = q.new_empty((num_tokens, num_heads, splits), dtype=torch.float32)
    else:
        partial, lse = out, out  # the kernel writes the output itself; lse is not touched
    paged = KernelLaunch(
        _paged_attention_kernel,
        (len(meta.query_lens), num_kv_heads, num_query_tiles * splits),
        (
            partial,
            lse,
            q,
            kv_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            scale * LOG2_E,
            q.stride(0),
            q.stride(1),
            *kv_cache.stride()[:4],
            meta.block_tables.stride(0),
        ),
        {
            "GROUP": group,
            "GROUP_P2": group_p2,
            "BLOCK_R": rows,
            "BLOCK_N": KEYS_PER_TILE[kv_cache.element_size()],
            "BLOCK_SIZE": block_size,
            "HEAD_DIM": head_dim,
            "HEAD_DIM_P2": head_dim_p2(head_dim),
            "NUM_SPLITS": splits,
            "DOT_DTYPE": dot_dtype(kv_cache.dtype),
            "DOT_PRECISION": "ieee" if kv_cache.dtype == torch.float32 else "tf32",
        },
        num_warps=num_warps,
        num_stages=num_stages,
        max_registers=None if decode or float32 else WIDE_MAX_REGISTERS,
    )
    if splits == 1:
        return out, [paged]
    combine = KernelLaunch(
        _combine_splits_kernel,
        (num_tokens, num_heads),
        (out, partial, lse),
        {"NUM_SPLITS": splits, "HEAD_DIM": head_dim, "HEAD_DIM_P2": head_dim_p2(head_dim)},
    )
    return out, [paged, combine]
