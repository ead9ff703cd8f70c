"""The Triton fused-MoE experts: every (token, chosen expert) pair computed as two grouped GEMMs, as vLLM's and
SGLang's fused_moe do.

1. Align (torch ops, no host sync): the T * k pairs sorted by expert, each expert's run padded to a multiple of
   BLOCK_M, so that every BLOCK_M-row block belongs to one expert. The buffers are sized for the worst case
   (every pair's expert padded), so shapes depend on T, k and E only and the whole thing runs inside a CUDA
   graph; the blocks past the real padded count exit at once.
2. Gate/up: per block, the rows' hidden states times the expert's [gate; up] rows, silu(gate) * up fused in
   the kernel, written per pair.
3. Down: per block, those times the expert's down projection, scaled by the pair's top-k weight in the
   kernel, written per pair in float32; the k pairs of a token are then summed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from openinfer.kernels.triton_launch import KernelLaunch
from openinfer.kernels.triton_tiles import dot_dtype

BLOCK_N = 64  # output columns per program
# Reduction tile by element size: 64 16-bit or 32 float32 elements (the A and two B tiles of the gate/up
# kernel stay at 24 KiB per pipeline stage either way).
BLOCK_K = {2: 64, 4: 32}


@triton.jit
def _gate_up_kernel(
    hidden_ptr,  # (T, H)
    w13_ptr,  # (E, 2 * I, H): gate rows [0, I), up rows [I, 2 * I)
    out_ptr,  # (T * k, I), hidden's dtype: silu(gate) * up per pair
    sorted_ids_ptr,  # (max_padded,) int64 pair index t * k + j, num_pairs where padding
    block_experts_ptr,  # (max_blocks,) int64 the expert of each BLOCK_M-row block
    num_padded_ptr,  # (1,) int64 rows of sorted_ids in use
    num_pairs,  # T * k
    hidden_size,
    inter_size,
    stride_hm,
    stride_we,
    stride_wn,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 (no TF32 rounding); unused for 16-bit
):
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return  # a block past the padded pairs: the buffers are sized for the worst case
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + rows)  # (M,)
    row_ok = pair < num_pairs
    token = pair // TOP_K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (N,) intermediate columns
    col_ok = cols < inter_size
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = hidden_ptr + token[:, None] * stride_hm + ks[None, :]  # (M, K)
    w_base = w13_ptr + expert * stride_we + ks[:, None]  # (K, 1), hidden's stride is 1
    gate_ptrs = w_base + cols[None, :] * stride_wn  # (K, N)
    up_ptrs = w_base + (cols[None, :] + inter_size) * stride_wn
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden_size, BLOCK_K):
        k_ok = ks + k0 < hidden_size
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        w_mask = k_ok[:, None] & col_ok[None, :]
        g = tl.load(gate_ptrs + k0, mask=w_mask, other=0.0).to(DOT_DTYPE)
        u = tl.load(up_ptrs + k0, mask=w_mask, other=0.0).to(DOT_DTYPE)
        gate = tl.dot(a, g, gate, input_precision=DOT_PRECISION)
        up = tl.dot(a, u, up, input_precision=DOT_PRECISION)
    act = gate / (1.0 + tl.exp(-gate)) * up  # (M, N) silu(gate) * up in float32
    out_ptrs = out_ptr + pair[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, act.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    act_ptr,  # (T * k, I): the gate/up kernel's output
    w2_ptr,  # (E, H, I)
    out_ptr,  # (T * k, H) float32: each pair's weighted contribution
    weights_ptr,  # (T * k,) float32 top-k weights
    sorted_ids_ptr,
    block_experts_ptr,
    num_padded_ptr,
    num_pairs,
    hidden_size,
    inter_size,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    pid_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + rows)  # (M,)
    row_ok = pair < num_pairs
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (N,) hidden columns
    col_ok = cols < hidden_size
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + pair[:, None] * stride_am + ks[None, :]  # (M, K)
    w_ptrs = w2_ptr + expert * stride_we + cols[None, :] * stride_wn + ks[:, None]  # (K, N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter_size, BLOCK_K):
        k_ok = ks + k0 < inter_size
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        w = tl.load(w_ptrs + k0, mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(DOT_DTYPE)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    weight = tl.load(weights_ptr + pair, mask=row_ok, other=0.0)  # (M,)
    out_ptrs = out_ptr + pair[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc * weight[:, None], mask=row_ok[:, None] & col_ok[None, :])


def block_m(num_pairs: int, num_experts: int) -> int:
    """Rows per block: 16 (tl.dot's least) while experts get a few pairs each (decode), 64 from 32 pairs per
    expert on average (prefill), where fewer, fuller blocks reuse each weight tile over more rows."""
    return 64 if num_pairs >= 32 * num_experts else 16


def align_block_size(topk_ids: Tensor, num_experts: int, block_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """The pairs sorted by expert, each expert's run padded to a multiple of ``block_size``, without a host
    sync: (sorted_ids (max_padded,) int64 pair indices, num_pairs where padding; block_experts (max_blocks,)
    int64; num_padded (1,) int64). Sized for the worst case, min(T * k, E) experts each padded by
    block_size - 1 rows; blocks at or past num_padded are unused (their expert is clamped to E - 1)."""
    device = topk_ids.device
    flat = topk_ids.flatten()  # (T * k,) expert of pair t * k + j
    num_pairs = flat.numel()
    max_padded = num_pairs + min(num_pairs, num_experts) * (block_size - 1)
    max_blocks = triton.cdiv(max_padded, block_size)
    # scatter_add, not bincount: bincount on CUDA reads its input's max on the host
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # (E,)
    padded = (counts + block_size - 1) // block_size * block_size  # (E,)
    padded_ends = padded.cumsum(0)  # (E,)
    order = torch.argsort(flat, stable=True)  # (T * k,) pair indices grouped by expert
    sorted_experts = flat[order]
    starts = counts.cumsum(0) - counts  # (E,) first sorted position of each expert's pairs
    rank = torch.arange(num_pairs, device=device) - starts[sorted_experts]  # position within its expert
    dest = padded_ends[sorted_experts] - padded[sorted_experts] + rank
    sorted_ids = torch.full((max_blocks * block_size,), num_pairs, dtype=torch.int64, device=device)
    sorted_ids[dest] = order
    block_starts = torch.arange(max_blocks, device=device) * block_size  # (max_blocks,)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, block_experts, padded_ends[-1:]


def moe_launches(
    hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor, act: Tensor, out: Tensor
) -> tuple[KernelLaunch, KernelLaunch]:
    """The gate/up and down launches writing ``act`` (T * k, I) and ``out`` (T * k, H) float32
    (fused_experts_triton and the compile check)."""
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    inter_size, top_k = two_inter // 2, topk_ids.shape[1]
    if topk_ids.shape[0] != num_tokens or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} need shape (T, k)"
            f" with T = {num_tokens} hidden rows"
        )
    if w13.shape[2] != hidden_size or w2.shape != (num_experts, hidden_size, inter_size):
        raise ValueError(f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit hidden {hidden_size}")
    if hidden.stride(1) != 1 or w13.stride(2) != 1 or w2.stride(2) != 1:
        raise ValueError("hidden, w13 and w2 need a contiguous last dimension")
    num_pairs = num_tokens * top_k
    rows = block_m(num_pairs, num_experts)
    sorted_ids, block_experts, num_padded = align_block_size(topk_ids, num_experts, rows)
    size = hidden.element_size()
    options = {
        "BLOCK_M": rows,
        "BLOCK_N": BLOCK_N,
        "BLOCK_K": BLOCK_K[size],
        "DOT_DTYPE": dot_dtype(hidden.dtype),
        "DOT_PRECISION": "ieee" if hidden.dtype == torch.float32 else "tf32",
    }
    routing = (sorted_ids, block_experts, num_padded, num_pairs, hidden_size, inter_size)
    num_blocks = block_experts.numel()
    gate_up = KernelLaunch(
        _gate_up_kernel,
        (num_blocks, triton.cdiv(inter_size, BLOCK_N)),
        (hidden, w13, act, *routing, hidden.stride(0), w13.stride(0), w13.stride(1), act.stride(0)),
        {"TOP_K": top_k, **options},
        num_stages=2 if size == 4 else 3,
    )
    weights = topk_weights.reshape(num_pairs)  # (T * k,) float32
    down = KernelLaunch(
        _down_kernel,
        (num_blocks, triton.cdiv(hidden_size, BLOCK_N)),
        (act, w2, out, weights, *routing, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0)),
        options,
        num_stages=2 if size == 4 else 3,
    )
    return gate_up, down


def fused_experts_triton(
    hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor
) -> Tensor:
    """Σ_j topk_weights[t, j] · W2_e (silu(G_e x_t) ⊙ U_e x_t), e = topk_ids[t, j], for hidden (T, H), w13
    (E, 2 * I, H) = [gate; up], w2 (E, H, I), topk_weights (T, k) float32, topk_ids (T, k) int64 -> (T, H) in
    hidden's dtype. No host sync: capturable in a CUDA graph."""
    num_tokens, hidden_size = hidden.shape
    top_k, inter_size = topk_ids.shape[1], w2.shape[2]
    act = hidden.new_empty(num_tokens * top_k, inter_size)  # (T * k, I)
    out = torch.empty(num_tokens * top_k, hidden_size, dtype=torch.float32, device=hidden.device)
    weights = topk_weights.to(torch.float32).contiguous()
    for launch in moe_launches(hidden, w13, w2, weights, topk_ids, act, out):
        launch.run()
    return out.view(num_tokens, top_k, hidden_size).sum(1).to(hidden.dtype)  # (T, k, H) -> (T, H)
