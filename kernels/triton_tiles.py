"""Triton building blocks the paged attention kernels share (``triton_attention.py``, the DFlash block attention
in ``triton_dflash_attention.py``): a program's query rows, an online softmax over tiles of keys, a tile of keys and
values read in place through a block table, and the tile sizes and launch options they are compiled with."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2_E = 1.4426950408889634  # scores are kept in log2 units so that the kernel can use exp2
DECODE_ROWS, VARLEN_ROWS = 16, 64  # BLOCK_R of the decode and varlen launches; tl.dot wants >= 16 rows
# BLOCK_N by cache element size: 64 keys of 16-bit, 32 of float32 (K and V tiles of 16 KiB at head_dim 128,
# so that the pipelined loop's shared memory stays well under an A100's 164 KiB).
KEYS_PER_TILE = {2: 64, 4: 32}
# Launch options found by benchmarks/triton_compile.py: with Triton's defaults (4 warps, 3 stages) the 64-row
# launches and float32 spill registers on sm_80 or sm_90. 8 warps spill nothing with 2 stages (16-bit) and
# 16 rows (float32: 1 stage for the varlen launch, 3 for decode and DFlash, as measured).
WIDE_WARPS, WIDE_STAGES = 8, 2
# The 16-bit varlen launch still spilled 4-12 bytes on sm_80 at some block sizes and GQA groups (24, 32, 64 with
# group 4-8: ptxas capped itself at 128 registers); letting it use up to 255 spills nothing (198-222 on sm_80,
# 129-153 on sm_90, benchmarks/triton_compile.py's full matrix).
WIDE_MAX_REGISTERS = 255


@triton.jit
def query_rows(
    kv_head, first_query, num_queries, GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_R: tl.constexpr
):
    """A program's BLOCK_R rows: BLOCK_R // GROUP_P2 queries from first_query on, each times the GROUP query heads
    of kv_head (GQA; GROUP_P2 - GROUP padding rows) -> query index (R,), query head (R,), whether the row is real
    (R,): not padding and query < num_queries."""
    rows = tl.arange(0, BLOCK_R)
    query = first_query + rows // GROUP_P2
    head = kv_head * GROUP + rows % GROUP_P2
    row_ok = (rows % GROUP_P2 < GROUP) & (query < num_queries)
    return query, head, row_ok


@triton.jit
def online_softmax_start(BLOCK_R: tl.constexpr, HEAD_DIM_P2: tl.constexpr):
    """The running max (finite: a row that sees no key stays NaN-free), sum of exp2 and output of
    `online_softmax_step` before the first tile."""
    m_i = tl.full([BLOCK_R], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, HEAD_DIM_P2], tl.float32)
    return m_i, l_i, acc


@triton.jit
def online_softmax_step(
    q, k, v, visible, m_i, l_i, acc, scale, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr
):
    """One tile of keys: q (R, D), k/v (N, D), visible (R, N) -> the updated running max, sum and output
    (scores in log2 units; a masked score adds nothing)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # (R, N)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])  # (R, N), 0 where masked
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def load_paged_kv(
    cache_ptr,
    table_row,  # the request's block-table row
    pos,  # (N,) key positions
    in_range,  # (N,) which of them to load (the others read as 0)
    kv_head,
    d,
    d_ok,
    stride_kv,
    stride_block,
    stride_slot,
    stride_head,
    BLOCK_SIZE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """The keys and values (N, D) at ``pos`` of one KV head, each position found in its block through the
    block-table row, in place in the paged cache."""
    block = tl.load(table_row + pos // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)  # (N,)
    kv_offset = block * stride_block + (pos % BLOCK_SIZE) * stride_slot + kv_head * stride_head
    kv_ptrs = cache_ptr + kv_offset[:, None] + d[None, :]  # (N, D)
    kv_mask = in_range[:, None] & d_ok[None, :]
    k = tl.load(kv_ptrs, mask=kv_mask, other=0.0).to(DOT_DTYPE)
    v = tl.load(kv_ptrs + stride_kv, mask=kv_mask, other=0.0).to(DOT_DTYPE)
    return k, v


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """The dtype of tl.dot's operands: the cache's, except bfloat16 under the interpreter, whose tl.dot
    multiplies bfloat16 bit patterns (triton-lang/triton#11584) and so gets float32 operands instead."""
    if dtype == torch.bfloat16 and triton.knobs.runtime.interpret:
        return tl.float32
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def head_dim_p2(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))
