"""DFlash block attention in Triton: each draft block's queries attend, non-causally, to the request's context
keys/values read in place from the paged context cache through the block table, then to the block's own keys.

``_block_attention_kernel``, grid (B, num_kv_heads, num_query_tiles): one program holds a tile of one
block's T queries times the query heads of one KV head (GQA, as ``_paged_attention_kernel`` in
triton_attention.py), as BLOCK_R rows, and keeps an online softmax in float32 (log2 units). It walks the
context positions [0, context_lens[b]) in tiles of BLOCK_N, finding each position's page in the block-table
row, then the block's first block_lens[b] keys (the rest of the T are padding). Columns of a block-table
row past its context are never read, so they may hold anything. A row with no keys at all (context_len 0
and block_len 0) gets a zero output, never NaN.

CUDA-graph friendly: context_lens, block_lens and the block tables are read on the device, and the grid uses
only B, T and the head counts.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from openinfer.kernels.triton_launch import KernelLaunch
from openinfer.kernels.triton_tiles import (
    DECODE_ROWS,
    KEYS_PER_TILE,
    LOG2_E,
    VARLEN_ROWS,
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
def _block_attention_kernel(
    out_ptr,  # (B, T, num_heads, head_dim) contiguous, in q's dtype
    q_ptr,  # (B, T, num_heads, head_dim)
    k_ptr,  # (B, T, num_kv_heads, head_dim): the block's own keys
    v_ptr,
    cache_ptr,  # (2, num_pages, page_size, num_kv_heads, head_dim)
    block_tables_ptr,  # (B, width)
    context_lens_ptr,  # (B,)
    block_lens_ptr,  # (B,)
    scale,  # softmax scale * log2(e)
    block_width,  # T
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_kv,
    stride_page,
    stride_slot,
    stride_head,
    stride_table,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_P2: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rows per program: BLOCK_R // GROUP_P2 queries x GROUP_P2 heads
    BLOCK_N: tl.constexpr,  # keys per tile
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    QUERIES: tl.constexpr = BLOCK_R // GROUP_P2
    context_len = tl.load(context_lens_ptr + req)
    block_len = tl.load(block_lens_ptr + req)

    # (R,) each: the row's slot of the block, its query head, whether it is real
    query, head, row_ok = query_rows(kv_head, tile * QUERIES, block_width, GROUP, GROUP_P2, BLOCK_R)
    d = tl.arange(0, HEAD_DIM_P2)
    d_ok = d < HEAD_DIM
    q_ptrs = q_ptr + req * stride_qb + query[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)  # (R, D)

    m_i, l_i, acc = online_softmax_start(BLOCK_R, HEAD_DIM_P2)
    table_row = block_tables_ptr + req.to(tl.int64) * stride_table
    for start in range(0, context_len, BLOCK_N):  # (a) the context, from the paged cache
        pos = start + tl.arange(0, BLOCK_N)  # (N,) context positions
        in_range = pos < context_len
        k, v = load_paged_kv(
            cache_ptr, table_row, pos, in_range, kv_head, d, d_ok,
            stride_kv, stride_page, stride_slot, stride_head, PAGE_SIZE, DOT_DTYPE,
        )  # fmt: skip
        m_i, l_i, acc = online_softmax_step(
            q, k, v, in_range[None, :], m_i, l_i, acc, scale, DOT_DTYPE, DOT_PRECISION
        )
    for start in range(0, block_len, BLOCK_N):  # (b) the block's own keys, dense
        slot = start + tl.arange(0, BLOCK_N)  # (N,)
        in_block = slot < block_len
        kv_mask = in_block[:, None] & d_ok[None, :]
        k_ptrs = k_ptr + req * stride_kb + slot[:, None] * stride_kt + kv_head * stride_kh + d[None, :]
        v_ptrs = v_ptr + req * stride_vb + slot[:, None] * stride_vt + kv_head * stride_vh + d[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        m_i, l_i, acc = online_softmax_step(
            q, k, v, in_block[None, :], m_i, l_i, acc, scale, DOT_DTYPE, DOT_PRECISION
        )

    num_heads = GROUP * tl.num_programs(1)
    out_row = (req * block_width + query).to(tl.int64) * num_heads + head  # (R,) row of (B * T * num_heads)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l_i == 0 only without keys: acc is 0 there
    out_ptrs = out_ptr + out_row[:, None] * HEAD_DIM + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), row_ok[:, None] & d_ok[None, :])


def block_attention_triton(
    q: Tensor, k: Tensor, v: Tensor, cache: Tensor,
    block_tables: Tensor, context_lens: Tensor, block_lens: Tensor, scale: float,
) -> Tensor:  # fmt: skip
    """DFlash block attention, non-causal: q (B, T, num_heads, head_dim) over request b's context positions
    [0, context_lens[b]) in `cache` (2, num_pages, page_size, num_kv_heads, head_dim), through
    block_tables (B, width) int32/int64, then over the first block_lens[b] of k/v (B, T, num_kv_heads,
    head_dim). Returns (B, T, num_heads, head_dim) in q's dtype. Any page order, context_len 0 allowed."""
    out = q.new_empty(q.shape)  # (B, T, num_heads, head_dim)
    if q.shape[0] and q.shape[1]:
        block_attention_launch(out, q, k, v, cache, block_tables, context_lens, block_lens, scale).run()
    return out


def block_attention_launch(
    out: Tensor, q: Tensor, k: Tensor, v: Tensor, cache: Tensor,
    block_tables: Tensor, context_lens: Tensor, block_lens: Tensor, scale: float,
) -> KernelLaunch:  # fmt: skip
    """The launch of `_block_attention_kernel` for B, T >= 1 (block_attention_triton and the compile check)."""
    batch, block_width, num_heads, head_dim = q.shape
    _, _, page_size, num_kv_heads, _ = cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"need num_heads ({num_heads}) a multiple of num_kv_heads ({num_kv_heads})")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or cache.stride(-1) != 1:
        raise ValueError("q, k, v and the cache need a contiguous head_dim")
    group = num_heads // num_kv_heads
    group_p2 = triton.next_power_of_2(group)
    # float32 spills on sm_90 past 16 rows (benchmarks/triton_compile.py), whatever the warps and stages
    max_rows = DECODE_ROWS if cache.dtype == torch.float32 else VARLEN_ROWS
    rows = max(16, group_p2, min(max_rows, triton.next_power_of_2(block_width) * group_p2))
    num_query_tiles = math.ceil(block_width / (rows // group_p2))
    return KernelLaunch(
        _block_attention_kernel,
        (batch, num_kv_heads, num_query_tiles),
        (
            out,
            q,
            k,
            v,
            cache,
            block_tables,
            context_lens,
            block_lens,
            scale * LOG2_E,
            block_width,
            *q.stride()[:3],
            *k.stride()[:3],
            *v.stride()[:3],
            *cache.stride()[:4],
            block_tables.stride(0),
        ),
        {
            "GROUP": group,
            "GROUP_P2": group_p2,
            "BLOCK_R": rows,
            "BLOCK_N": KEYS_PER_TILE[cache.element_size()],
            "PAGE_SIZE": page_size,
            "HEAD_DIM": head_dim,
            "HEAD_DIM_P2": head_dim_p2(head_dim),
            "DOT_DTYPE": dot_dtype(cache.dtype),
            "DOT_PRECISION": "ieee" if cache.dtype == torch.float32 else "tf32",
        },
        num_warps=WIDE_WARPS,
        num_stages=3 if cache.dtype == torch.float32 else WIDE_STAGES,
    )
