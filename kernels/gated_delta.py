"""The linear-attention layers of Qwen3.5 (Gated DeltaNet) over a packed batch, in torch: `causal_conv1d` and
`gated_delta_rule`, each reading and writing per-request state slots through a `StateIndex` (state_index.py).

Semantics are transformers' (`causal_conv1d_fn` / `causal_conv1d_update` with SiLU and no bias;
`torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule` with use_qk_l2norm_in_kernel=True), run on
each request's tokens alone from the state its read slot holds.

Two forms, chosen by the step's longest request (`RECURRENT_MAX_QUERY_LEN`):
- short steps (decode, verification) run every request together on a (B, max_query_len) padded grid, one
  position at a time. This form reads only StateIndex's device tensors and shapes: no host sync, nothing
  data-dependent (tests run it on meta tensors). A CUDA graph captured for a fixed (B, max_query_len, N) replays
  any slots once new values are copied into those same tensors (read_slots, write_slots, padded_tokens,
  padded_write_slots, token_positions); slot -1 stores nothing through `masked_store`;
- long steps run request by request, the chunked form (`gated_delta_chunk.py`) for requests longer than the
  threshold; they store only the tokens whose host write slot is >= 0.

These are the CPU's kernels and every device's reference. On CUDA the engine's kernel table (kernel_backends.py)
runs the short form as Triton kernels (`triton_gated_delta.py`, `triton_causal_conv1d.py`) and the gated delta
rule's long one through flash-linear-attention's chunked kernel where `fla` is installed (`fla_gated_delta.py`);
a long step's conv stays torch.

Every initial state is read before anything is written (gathered by the torch forms and fla's; the Triton kernels
copy the few another request overwrites first), so a write slot may equal any read slot. On the CPU, where
StateIndex's host facts are trusted, a decode whose requests own a block of consecutive slots (each reads and
writes its own, nobody else's) updates that block in place, and a gather skips its zero fill when no read is -1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from openinfer.kernels.gated_delta_chunk import chunk_gated_delta
from openinfer.kernels.state_index import RECURRENT_MAX_QUERY_LEN, StateIndex, read_states

# CPU convs of at most this many outputs (B * L * C) sum their taps instead of calling conv1d: on one core the
# sum takes 13 us at 512 outputs against conv1d's 82, breaks even near 16K, and is 2x conv1d's 0.8 ms at 256K.
CONV_SUM_MAX_OUTPUTS = 16384
L2NORM_EPS = 1e-6  # transformers' (and FLA's) l2norm eps


def masked_store(dest: Tensor, slots: Tensor, rows: Tensor) -> None:
    """dest[slots[m]] = rows[m] for every m with slots[m] >= 0; nothing else of dest changes; no host sync.

    Skipped rows are sent to one "fill" slot, the first kept row's (slot 0 when no row is kept), by the same
    index_copy_ as the kept rows; whichever of them lands there last, a one-row copy then puts the right value
    back: the first kept row, or slot 0's value from before. So the store costs one copy of the M rows, with no
    masked pass over them. Kept rows must not share a slot.
    """
    keep = slots >= 0  # (M,)
    # index_select, not slots[first]: a 0-dim index tensor is read on the host (.item(), a sync).
    first = keep.to(torch.int32).argmax().view(1)  # (1,) the first kept row; row 0 when none is kept
    any_kept = keep.any()  # () bool
    fill_slot = torch.where(any_kept, slots.index_select(0, first), 0)  # (1,)
    # (1, *row_shape): the first kept row, or slot 0's value read before the copy below
    fill_row = torch.where(any_kept, rows.index_select(0, first), dest[:1])
    dest.index_copy_(0, torch.where(keep, slots, fill_slot), rows)
    dest.index_copy_(0, fill_slot, fill_row)


def causal_conv1d(x: Tensor, weight: Tensor, conv_state: Tensor, index: StateIndex) -> Tensor:
    """x (N, C) packed tokens (the in_proj_qkv output), weight (C, W) depthwise kernel, conv_state (S, C, W-1) in
    x's dtype: per request, a causal depthwise conv over [state inputs, its tokens] then SiLU; returns (N, C) in
    x's dtype. conv_state[s] holds the W-1 inputs before a request's next token (zeros when read_slots[b] == -1).
    After the call conv_state[write_slots[t]] holds the W-1 inputs ending at token t (inclusive)."""
    init = read_states(conv_state, index.read_slots, zero_reads=index.zero_reads)  # (B, C, W-1)
    if index.max_query_len <= RECURRENT_MAX_QUERY_LEN:
        grid = x[index.padded_tokens]  # (B, L, C)
        out, windows = _conv_grid(grid, init, weight)  # (B, L, C), (B, L, C, W-1)
        flat = index.token_positions
        masked_store(conv_state, index.write_slots, windows.flatten(0, 1)[flat])
        return out.flatten(0, 1)[flat]
    out = torch.empty_like(x)
    loc = index.query_start_loc
    for b in range(index.num_requests):
        lo, hi = loc[b], loc[b + 1]
        request_out, windows = _conv_grid(x[None, lo:hi], init[b : b + 1], weight)
        out[lo:hi] = request_out[0]
        writes = [(t - lo, s) for t, s in enumerate(index.host_write_slots[lo:hi], start=lo) if s >= 0]
        if writes:  # copy only the windows stored (a prefill chunk typically stores its last one)
            offsets, slots = (torch.tensor(column, device=x.device) for column in zip(*writes, strict=True))
            conv_state.index_copy_(0, slots, windows[0, offsets])
    return out


def _conv_grid(grid: Tensor, init: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """grid (B, L, C) tokens, init (B, C, W-1) the inputs before them, weight (C, W): the SiLU conv output
    (B, L, C) in grid's dtype (computed in weight's dtype, as transformers does) and, per position, the W-1
    inputs ending there (B, L, C, W-1)."""
    width = weight.shape[1]
    seq = torch.cat([init, grid.transpose(1, 2)], dim=2)  # (B, C, W-1 + L)
    if grid.device.type == "cpu" and grid.numel() <= CONV_SUM_MAX_OUTPUTS:
        # mkldnn conv1d's fixed cost (~80 us on one core) dwarfs a small step: sum the taps in float32
        taps = seq.to(weight.dtype).float().unfold(2, width, 1)  # (B, C, L, W)
        out = (taps * weight.float()[:, None, :]).sum(dim=-1).to(weight.dtype)  # (B, C, L)
    else:
        out = F.conv1d(seq.to(weight.dtype), weight[:, None, :], groups=weight.shape[0])  # (B, C, L)
    out = F.silu(out).to(grid.dtype).transpose(1, 2)  # (B, L, C)
    windows = seq.unfold(2, width - 1, 1)[:, :, 1:]  # (B, C, L, W-1): window i+1 ends at token i
    return out, windows.transpose(1, 2)


def l2norm(x: Tensor) -> Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in x's dtype (transformers' l2norm)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, index: StateIndex,
    *, recurrent_max_query_len: int = RECURRENT_MAX_QUERY_LEN,
) -> Tensor:  # fmt: skip
    """q, k (N, Hk, Dk); v (N, Hv, Dv) (Hv a multiple of Hk: each q/k head serves Hv/Hk consecutive v heads,
    repeat_interleave); g (N, Hv) float32 log-decay; beta (N, Hv); state (S, Hv, Dk, Dv) float32.
    q and k are L2-normalised here in float32 (eps 1e-6, transformers' l2norm), q scaled by Dk**-0.5.
    Returns (N, Hv, Dv) in v's dtype. Reads/writes state slots as causal_conv1d does (the recurrent state after
    token t). recurrent_max_query_len moves the threshold between the forms (benchmarks compare them with it)."""
    short = index.max_query_len <= recurrent_max_query_len
    groups = v.shape[1] // k.shape[1]
    q32 = l2norm(q.float()) * q.shape[-1] ** -0.5  # (N, Hk, Dk)
    k32 = l2norm(k.float())
    if groups > 1:
        q32, k32 = q32.repeat_interleave(groups, dim=1), k32.repeat_interleave(groups, dim=1)  # (N, Hv, Dk)
    v32, g32, beta32 = v.float(), g.float(), beta.float()
    if index.own_block is not None:  # a CPU decode's block of slots (StateIndex.build: host facts)
        return _decode_in_place(q32, k32, v32, g32, beta32, state, *index.own_block).to(v.dtype)
    # (B, Hv, Dk, Dv) float32, every read before any write
    h0 = read_states(state, index.read_slots, zero_reads=index.zero_reads)
    if short:
        # Padded positions come after their request's last token: what they do to its state is never stored
        # (their write slots are -1) and their outputs are never gathered.
        tokens = index.padded_tokens  # (B, L)
        grid = (q32[tokens], k32[tokens], v32[tokens], g32[tokens].exp(), beta32[tokens])
        out = _recurrent(*grid, h0, state, index.padded_write_slots)  # (B, L, Hv, Dv)
        return out.flatten(0, 1)[index.token_positions].to(v.dtype)
    out = torch.empty_like(v32)  # (N, Hv, Dv)
    loc = index.query_start_loc
    for b in range(index.num_requests):
        lo, hi = loc[b], loc[b + 1]
        if hi - lo <= recurrent_max_query_len:
            decay = g32[None, lo:hi].exp()
            args = (q32[None, lo:hi], k32[None, lo:hi], v32[None, lo:hi], decay, beta32[None, lo:hi])
            out[lo:hi] = _recurrent(*args, h0[b : b + 1], state, index.write_slots[None, lo:hi])[0]
            continue
        writes = [(t - lo, s) for t, s in enumerate(index.host_write_slots[lo:hi], start=lo) if s >= 0]
        args = (q32[lo:hi], k32[lo:hi], v32[lo:hi], g32[lo:hi], beta32[lo:hi])
        out[lo:hi] = chunk_gated_delta(*args, h0[b], state, writes)
    return out.to(v.dtype)


def _decode_in_place(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, first: int, order: list[int]
) -> Tensor:
    """One token a request (q, k (B, Hv, Dk); v (B, Hv, Dv); g, beta (B, Hv), float32), request order[j] reading
    and writing slot first + j and no other request touching it: the recurrence updates state[first : first + B]
    in place (no gather, no store). Returns the outputs (B, Hv, Dv) in request order."""
    rows = torch.tensor(order, device=q.device)  # (B,) the requests in slot order
    grid = (q[rows, None], k[rows, None], v[rows, None], g[rows, None].exp(), beta[rows, None])  # (B, 1, ...)
    block = state[first : first + len(order)]  # (B, Hv, Dk, Dv), a view of the requests' own slots
    by_slot = _recurrent(*grid, block, state, None)[:, 0]  # (B, Hv, Dv) in slot order
    return torch.empty_like(by_slot).index_copy_(0, rows, by_slot)


def _recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    decay: Tensor,
    beta: Tensor,
    h0: Tensor,
    state: Tensor,
    write_slots: Tensor | None,
) -> Tensor:
    """The recurrent form over B sequences of L positions, float32: q, k (B, L, H, Dk), v (B, L, H, Dv), decay
    (= exp(g)) and beta (B, L, H), h0 (B, H, Dk, Dv) (consumed: updated in place). After position i,
    state[write_slots[b, i]] = h[b] where write_slots[b, i] >= 0; write_slots None: h0 is a view of the state
    slots themselves, nothing to store. Returns the outputs (B, L, H, Dv)."""
    batch, length, heads, dk = k.shape
    dv = v.shape[-1]
    h = h0.view(batch * heads, dk, dv)
    out = torch.empty_like(v)
    for i in range(length):
        h.mul_(decay[:, i].reshape(-1, 1, 1))
        k_i = k[:, i].reshape(-1, 1, dk)  # (B * H, 1, Dk)
        predicted = torch.bmm(k_i, h)  # (B * H, 1, Dv) what the decayed state recalls for k_i
        delta = (v[:, i].reshape(-1, 1, dv) - predicted) * beta[:, i].reshape(-1, 1, 1)
        h.baddbmm_(k_i.transpose(1, 2), delta)  # h += k_i delta^T
        out[:, i] = torch.bmm(q[:, i].reshape(-1, 1, dk), h).view(batch, heads, dv)
        if write_slots is not None:
            masked_store(state, write_slots[:, i], h.view(batch, heads, dk, dv))
    return out
