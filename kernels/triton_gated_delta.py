"""The recurrent gated delta rule in Triton over state slots: the CUDA form of `gated_delta_rule`'s short path
(decode and verification steps, at most RECURRENT_MAX_QUERY_LEN tokens a request).

One program per (request b, value head h, tile of BLOCK_V value columns) holds S = state[read_slots[b], h, :,
tile] (Dk x BLOCK_V, float32; zeros when the read slot is -1) in registers and runs the request's positions in
order: S *= exp(g); delta = beta (v - k.S); S += k delta^T; o = q.S, storing S to state[w, h, :, tile] after a
token whose write slot w is >= 0. The state columns of one (h, tile) are disjoint from every other program's
except across requests, so the only hazard is between requests: request b' storing into the slot request b
reads, in an order the GPU does not fix. Hence two launches:

1. save (`read_conflicts` decides, on the device): the initial states of just the requests whose read slot
   another request writes this step are copied into a scratch buffer; every other program exits at once.
2. recur: each program reads its initial state from the scratch buffer when its request was saved, from the
   slot itself otherwise, all before its first store; a request writing its own read slot is safe, its one
   program having loaded the state first.

So a step without such a conflict (the engine's usual one) moves each state once in and once out, where a gather
of every initial state (the torch path's index_select) would move it twice more; the scratch buffer is B states
as that gather's was, allocated but untouched. Nothing reads back to the host and every shape follows (B, L,
N): both launches replay in a CUDA graph. The conv (`triton_causal_conv1d.py`) reads its slots the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from openinfer.kernels.gated_delta import L2NORM_EPS
from openinfer.kernels.state_index import StateIndex
from openinfer.kernels.triton_launch import KernelLaunch

BLOCK_V = 8  # value columns per program: a 128 x 8 float32 state tile is 32 registers a thread of one warp
SAVE_BLOCK = 1024  # state elements a save program copies: 8 a thread of 4 warps


@triton.jit
def request_length(padded_tokens_ptr, grid_row, max_len, BLOCK_L: tl.constexpr):
    """The token count of the request whose (L,) row of StateIndex.padded_tokens starts at grid_row: positions
    past its length hold its first token again, and its tokens are distinct."""
    positions = tl.arange(0, BLOCK_L)
    first = tl.load(padded_tokens_ptr + grid_row)
    tokens = tl.load(padded_tokens_ptr + grid_row + positions, mask=positions < max_len, other=first)  # (L,)
    return 1 + tl.sum(((positions > 0) & (tokens != first)).to(tl.int32), axis=0)


@triton.jit
def _save_kernel(
    state_ptr,  # (S, *slot_shape), contiguous: slot s is elements [s * slot_size, (s + 1) * slot_size)
    saved_ptr,  # (B, *slot_shape) scratch
    read_slots_ptr,  # (B,) int64
    conflicts_ptr,  # (B,) bool: request b's read slot is written by another request this step
    slot_size,
    BLOCK: tl.constexpr,  # elements per program
):
    """saved[b] = state[read_slots[b]] for the requests flagged in conflicts, BLOCK elements a program; the
    gated delta rule's and the causal conv's save launch alike (`save_launch`)."""
    b, part = tl.program_id(0), tl.program_id(1)
    if tl.load(conflicts_ptr + b) == 0:
        return
    offsets = part * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < slot_size
    slot = tl.load(read_slots_ptr + b)  # >= 0 where a conflict is flagged
    values = tl.load(state_ptr + slot * slot_size + offsets, mask=mask)
    tl.store(saved_ptr + b.to(tl.int64) * slot_size + offsets, values, mask=mask)


@triton.jit
def _recurrent_kernel(
    q_ptr,  # (N, Hk, Dk), last dim contiguous
    k_ptr,  # (N, Hk, Dk)
    v_ptr,  # (N, Hv, Dv)
    g_ptr,  # (N, Hv) float32 log-decay
    beta_ptr,  # (N, Hv)
    out_ptr,  # (N, Hv, Dv) in v's dtype
    state_ptr,  # (S, Hv, Dk, Dv) float32, contiguous
    saved_ptr,  # (B, Hv, Dk, Dv) float32: the save kernel's copies of conflicting requests' initial states
    read_slots_ptr,  # (B,) int64
    conflicts_ptr,  # (B,) bool
    padded_tokens_ptr,  # (B, L) int64: token of (b, i), the request's first token past its length
    padded_write_slots_ptr,  # (B, L) int64: write slot of (b, i), -1 for none and past its length
    max_len,  # L
    dk,
    dv,
    stride_qn,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_gn,
    stride_betan,
    stride_on,
    stride_oh,
    GROUP: tl.constexpr,  # Hv // Hk: value head h reads key head h // GROUP
    SCALE: tl.constexpr,  # Dk ** -0.5
    EPS: tl.constexpr,
    BLOCK_L: tl.constexpr,  # next power of two >= L
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b, h, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    heads = tl.num_programs(1)
    rows, cols = tl.arange(0, BLOCK_K), tile * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok, col_ok = rows < dk, cols < dv
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = h * dk * dv + rows[:, None] * dv + cols[None, :]  # (K, V) within one slot
    slot_size = heads * dk * dv
    read = tl.load(read_slots_ptr + b)
    if tl.load(conflicts_ptr + b) != 0:
        s = tl.load(saved_ptr + b.to(tl.int64) * slot_size + offsets, mask=mask, other=0.0)
    else:
        read_rows = tl.where(read >= 0, dk, 0)  # no row of slot -1 is read: zeros
        read_mask = (rows[:, None] < read_rows) & col_ok[None, :]
        s = tl.load(state_ptr + tl.maximum(read, 0) * slot_size + offsets, mask=read_mask, other=0.0)
    grid_row = b.to(tl.int64) * max_len
    length = request_length(padded_tokens_ptr, grid_row, max_len, BLOCK_L)
    kh = h // GROUP
    for i in range(0, length):
        t = tl.load(padded_tokens_ptr + grid_row + i)
        q = tl.load(q_ptr + t * stride_qn + kh * stride_qh + rows, mask=row_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t * stride_kn + kh * stride_kh + rows, mask=row_ok, other=0.0).to(tl.float32)
        q = q * tl.math.rsqrt(tl.sum(q * q, axis=0) + EPS) * SCALE  # (K,)
        k = k * tl.math.rsqrt(tl.sum(k * k, axis=0) + EPS)
        v = tl.load(v_ptr + t * stride_vn + h * stride_vh + cols, mask=col_ok, other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + t * stride_gn + h).to(tl.float32))
        beta = tl.load(beta_ptr + t * stride_betan + h).to(tl.float32)
        s = s * decay
        delta = (v - tl.sum(s * k[:, None], axis=0)) * beta  # (V,) what the decayed state misses of v
        s = s + k[:, None] * delta[None, :]
        o = tl.sum(s * q[:, None], axis=0)  # (V,)
        tl.store(out_ptr + t * stride_on + h * stride_oh + cols, o.to(out_ptr.dtype.element_ty), mask=col_ok)
        write = tl.load(padded_write_slots_ptr + grid_row + i)
        if write >= 0:
            tl.store(state_ptr + write * slot_size + offsets, s, mask=mask)


def read_conflicts(index: StateIndex) -> Tensor:
    """(B,) bool: request b's read slot is >= 0 and another request's token stores into it this step; on the
    device, no host sync."""
    reads, writes = index.read_slots, index.padded_write_slots  # (B,), (B, L)
    stored = (writes[None, :, :] == reads[:, None, None]).any(-1)  # (B reader, B writer)
    others = ~torch.eye(index.num_requests, dtype=torch.bool, device=reads.device)
    return (stored & others).any(-1) & (reads >= 0)


def save_launch(state: Tensor, saved: Tensor, read_slots: Tensor, conflicts: Tensor) -> KernelLaunch:
    """The save launch (step 1 of the module docstring) of a contiguous state (S, *slot_shape) into saved
    (B, *slot_shape): the initial states of the requests `conflicts` (B,) flags, from their `read_slots` (B,)."""
    slot_size = state[0].numel()
    grid = (read_slots.shape[0], triton.cdiv(slot_size, SAVE_BLOCK))
    args = (state, saved, read_slots, conflicts, slot_size)
    return KernelLaunch(_save_kernel, grid, args, {"BLOCK": SAVE_BLOCK}, num_warps=4, num_stages=1)


def gated_delta_launches(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, index: StateIndex,
    out: Tensor, saved: Tensor, conflicts: Tensor,
) -> tuple[KernelLaunch, KernelLaunch]:  # fmt: skip
    """The save and recur launches (gated_delta_rule_triton and the compile check); shapes as in
    `gated_delta_rule_triton`, out (N, Hv, Dv), saved (B, Hv, Dk, Dv) float32, conflicts (B,) bool."""
    num_requests, max_len = index.num_requests, index.max_query_len
    heads, dk, dv = state.shape[1:]
    if q.shape != k.shape or v.shape[1] % k.shape[1] or v.shape[1] != heads or k.shape[2] != dk:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)} (N, Hk, Dk) and v {tuple(v.shape)} (N, Hv, Dv) do not fit the"
            f" state {tuple(state.shape)} (S, Hv, Dk, Dv) with Hv a multiple of Hk"
        )
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"the state must be contiguous float32, got {state.dtype}")
    if q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1 or g.stride(1) != 1 or beta.stride(1) != 1:
        raise ValueError("q, k, v, g and beta need a contiguous last dimension")
    block_k = max(16, triton.next_power_of_2(dk))
    grid = (num_requests, heads, triton.cdiv(dv, BLOCK_V))
    save = save_launch(state, saved, index.read_slots, conflicts)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    recur = KernelLaunch(
        _recurrent_kernel,
        grid,
        (q, k, v, g, beta, out, state, saved, index.read_slots, conflicts, index.padded_tokens)
        + (index.padded_write_slots, max_len, dk, dv, *strides, g.stride(0), beta.stride(0))
        + (out.stride(0), out.stride(1)),
        {
            "GROUP": heads // k.shape[1],
            "SCALE": dk**-0.5,
            "EPS": L2NORM_EPS,
            "BLOCK_L": triton.next_power_of_2(max_len),
            "BLOCK_K": block_k,
            "BLOCK_V": BLOCK_V,
        },
        num_warps=1,
        num_stages=1,
    )
    return save, recur


def gated_delta_rule_triton(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, index: StateIndex
) -> Tensor:
    """`gated_delta_rule`'s short path: q, k (N, Hk, Dk); v (N, Hv, Dv); g (N, Hv) float32; beta (N, Hv); state
    (S, Hv, Dk, Dv) float32; the slots and the (B, L) grid of `index` (its device tensors only). q and k are
    L2-normalised in float32 in the kernel, q scaled by Dk**-0.5. Returns (N, Hv, Dv) in v's dtype; state[w]
    holds the state after each token whose write slot w is >= 0. No host sync."""
    num_requests = index.num_requests
    out = torch.empty_like(v, memory_format=torch.contiguous_format)  # every token's row is stored
    saved = state.new_empty(num_requests, *state.shape[1:])  # (B, Hv, Dk, Dv), rows of conflicts only
    conflicts = read_conflicts(index)
    for launch in gated_delta_launches(q, k, v, g, beta, state, index, out, saved, conflicts):
        launch.run()
    return out
