"""The causal depthwise conv of the Gated DeltaNet layers in Triton over state slots: the CUDA form of
`causal_conv1d`'s short path (decode and verification steps, at most RECURRENT_MAX_QUERY_LEN tokens a request).

One program per (request b, tile of BLOCK_C channels) holds the request's last W inputs of its channels in
registers, starting from the W-1 that conv_state[read_slots[b]] holds (zeros when the read slot is -1), and runs
its positions in order: take in the token's inputs, out = silu(sum_w weight[c, w] * window[c, w]), and store the
W-1 inputs ending at the token to conv_state[w] when its write slot w is >= 0. Rounding follows `_conv_grid`
(transformers'): inputs converted to the weight's dtype, products summed in float32 and rounded to the weight's
dtype, SiLU rounded to it again, then converted to x's dtype.

Programs of one request touch disjoint channels, so the only hazard is another request storing into the slot a
request reads; it is handled as in `triton_gated_delta.py`, whose `read_conflicts` decides on the device which
requests' initial states a save launch copies to scratch first. No host sync, every shape follows (B, L, N): both
launches replay in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from openinfer.kernels.state_index import StateIndex
from openinfer.kernels.triton_gated_delta import read_conflicts, request_length, save_launch
from openinfer.kernels.triton_launch import KernelLaunch

# Channels per program: one a thread of 4 warps, its W = 4 window inputs in 4 registers; Qwen3.5's 8192 channels
# are 64 programs a request.
BLOCK_C = 128
NUM_WARPS = 4


@triton.jit
def _conv_kernel(
    x_ptr,  # (N, C), channels contiguous
    weight_ptr,  # (C, W), taps contiguous
    out_ptr,  # (N, C) in x's dtype
    state_ptr,  # (S, C, W-1) in x's dtype, contiguous
    saved_ptr,  # (B, C, W-1): the save kernel's copies of conflicting requests' initial inputs
    read_slots_ptr,  # (B,) int64
    conflicts_ptr,  # (B,) bool
    padded_tokens_ptr,  # (B, L) int64: token of (b, i), the request's first token past its length
    padded_write_slots_ptr,  # (B, L) int64: write slot of (b, i), -1 for none and past its length
    max_len,  # L
    channels,
    stride_xn,
    stride_wc,
    stride_on,
    WIDTH: tl.constexpr,
    BLOCK_L: tl.constexpr,  # next power of two >= L
    BLOCK_C: tl.constexpr,
    BLOCK_W: tl.constexpr,  # next power of two >= W
):
    b, tile = tl.program_id(0), tl.program_id(1)
    chans, cols = tile * BLOCK_C + tl.arange(0, BLOCK_C), tl.arange(0, BLOCK_W)
    chan_ok, col_ok = chans < channels, cols < WIDTH
    # The request's inputs are p = 0, 1, ...: its W-1 state inputs, then token i as p = W-1+i. The window keeps
    # the last W of them, input p in column p % W, so taking in a token overwrites just the oldest column.
    slot_size = channels * (WIDTH - 1)
    offsets = chans[:, None] * (WIDTH - 1) + cols[None, :]  # (C, W) within one slot
    mask = chan_ok[:, None] & (cols[None, :] < WIDTH - 1)
    read = tl.load(read_slots_ptr + b)
    if tl.load(conflicts_ptr + b) != 0:
        window = tl.load(saved_ptr + b.to(tl.int64) * slot_size + offsets, mask=mask, other=0.0)
    else:
        read_cols = tl.where(read >= 0, WIDTH - 1, 0)  # nothing of slot -1 is read: zeros
        read_mask = chan_ok[:, None] & (cols[None, :] < read_cols)
        window = tl.load(state_ptr + tl.maximum(read, 0) * slot_size + offsets, mask=read_mask, other=0.0)
    grid_row = b.to(tl.int64) * max_len
    length = request_length(padded_tokens_ptr, grid_row, max_len, BLOCK_L)
    weight_rows = weight_ptr + chans[:, None] * stride_wc  # (C, 1)
    for i in range(0, length):
        t = tl.load(padded_tokens_ptr + grid_row + i)
        token = tl.load(x_ptr + t * stride_xn + chans, mask=chan_ok, other=0.0)  # (C,)
        window = tl.where(cols[None, :] == (i + WIDTH - 1) % WIDTH, token[:, None], window)
        # Column k holds input p = i + tap, tap = (k - i) mod W: the weight it meets (the newest meets W-1).
        taps = (cols + WIDTH - i % WIDTH) % WIDTH  # (W,)
        weight = tl.load(weight_rows + taps[None, :], mask=chan_ok[:, None] & col_ok[None, :], other=0.0)
        inputs = window.to(weight_ptr.dtype.element_ty).to(tl.float32)
        conv = tl.sum(inputs * weight.to(tl.float32), axis=1).to(weight_ptr.dtype.element_ty).to(tl.float32)
        silu = (conv / (1.0 + tl.exp(-conv))).to(weight_ptr.dtype.element_ty)  # (C,)
        tl.store(out_ptr + t * stride_on + chans, silu.to(out_ptr.dtype.element_ty), mask=chan_ok)
        write = tl.load(padded_write_slots_ptr + grid_row + i)
        if write >= 0:
            # The W-1 inputs ending at token i, p = i+1 .. i+W-1: column k goes to place (k - i - 1) mod W; the
            # oldest column (p = i, place W-1) is left out.
            places = (cols + WIDTH - (i + 1) % WIDTH) % WIDTH  # (W,)
            store_mask = chan_ok[:, None] & col_ok[None, :] & (places[None, :] < WIDTH - 1)
            store_offsets = write * slot_size + chans[:, None] * (WIDTH - 1) + places[None, :]
            tl.store(state_ptr + store_offsets, window, mask=store_mask)


def causal_conv1d_launches(
    x: Tensor,
    weight: Tensor,
    conv_state: Tensor,
    index: StateIndex,
    out: Tensor,
    saved: Tensor,
    conflicts: Tensor,
    block_channels: int = BLOCK_C,
) -> tuple[KernelLaunch, KernelLaunch]:
    """The save and conv launches (causal_conv1d_triton and the compile check); shapes as in
    `causal_conv1d_triton`, out (N, C) contiguous, saved (B, C, W-1) in x's dtype, conflicts (B,) bool."""
    channels, width = weight.shape
    if x.shape[1] != channels or conv_state.shape[1:] != (channels, width - 1) or width < 2:
        raise ValueError(
            f"x {tuple(x.shape)} (N, C), weight {tuple(weight.shape)} (C, W >= 2) and conv_state"
            f" {tuple(conv_state.shape)} (S, C, W-1) do not fit together"
        )
    if conv_state.dtype != x.dtype or not conv_state.is_contiguous():
        raise ValueError(f"conv_state must be contiguous in x's dtype {x.dtype}, got {conv_state.dtype}")
    if x.stride(1) != 1 or weight.stride(1) != 1 or not out.is_contiguous():
        raise ValueError("x and weight need a contiguous last dimension, out a contiguous layout")
    block_w = triton.next_power_of_2(width)
    grid = (index.num_requests, triton.cdiv(channels, block_channels))
    shapes = {"WIDTH": width, "BLOCK_C": block_channels, "BLOCK_W": block_w}
    save = save_launch(conv_state, saved, index.read_slots, conflicts)
    conv = KernelLaunch(
        _conv_kernel,
        grid,
        (x, weight, out, conv_state, saved, index.read_slots, conflicts, index.padded_tokens)
        + (
            index.padded_write_slots,
            index.max_query_len,
            channels,
            x.stride(0),
            weight.stride(0),
            out.stride(0),
        ),
        {**shapes, "BLOCK_L": triton.next_power_of_2(index.max_query_len)},
        num_warps=NUM_WARPS,
        num_stages=1,
    )
    return save, conv


def causal_conv1d_triton(
    x: Tensor, weight: Tensor, conv_state: Tensor, index: StateIndex, block_channels: int = BLOCK_C
) -> Tensor:
    """`causal_conv1d`'s short path: x (N, C), weight (C, W), conv_state (S, C, W-1) in x's dtype; the slots and
    the (B, L) grid of `index` (its device tensors only). Returns silu(conv) (N, C) in x's dtype; conv_state[w]
    holds the W-1 inputs ending at each token whose write slot w is >= 0. No host sync. block_channels: channels
    per program (tests make it small to cover several tiles)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # every token's row is stored
    saved = conv_state.new_empty(
        index.num_requests, *conv_state.shape[1:]
    )  # (B, C, W-1), conflicts' rows only
    conflicts = read_conflicts(index)
    for launch in causal_conv1d_launches(x, weight, conv_state, index, out, saved, conflicts, block_channels):
        launch.run()
    return out
