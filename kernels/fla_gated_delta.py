"""`gated_delta_rule`'s long steps (prefill chunks) on CUDA through flash-linear-attention's chunked kernel, where
the optional `gdn` extra installs it (`pip install 'openinfer[gdn]'`).

fla's `chunk_gated_delta_rule` takes a packed batch (cu_seqlens) with one initial state per sequence and returns
each sequence's outputs and final state; ours also stores the state after arbitrary tokens (the host write
slots: a prefill chunk's last token, prefix-cache interval positions). So each request is cut after every token
that writes, into consecutive segments whose final states are exactly the states to store, each segment
starting from the previous one's final state. Segments of one request depend on each other, those of different
requests do not: round r packs every request's r-th segment into one call, so a step costs as many calls as its
most-cut request has segments (one, for a plain prefill chunk that stores its last state).

Every initial state is gathered (copied) before the first call, so a write slot may equal any read slot. fla's
varlen path reads its chunk offsets on the host: long steps are not graph-captured anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.kernels.state_index import StateIndex, read_states


@dataclass(frozen=True)
class Segment:
    """Tokens [start, end) of the step, a run of request `request`'s, storing its final state in `slot`."""

    request: int
    start: int
    end: int
    slot: int | None  # None: the request's tail after its last write, whose final state is not stored


def segment_rounds(query_start_loc: list[int], host_write_slots: list[int]) -> list[list[Segment]]:
    """Each request cut after every token with a write slot >= 0; round r holds every request's r-th segment,
    in request order."""
    rounds: list[list[Segment]] = []
    for b in range(len(query_start_loc) - 1):
        start, end = query_start_loc[b], query_start_loc[b + 1]
        cuts = [(t + 1, slot) for t in range(start, end) if (slot := host_write_slots[t]) >= 0]
        if not cuts or cuts[-1][0] < end:
            cuts.append((end, -1))
        lo = start
        for r, (hi, slot) in enumerate(cuts):
            if r == len(rounds):
                rounds.append([])
            rounds[r].append(Segment(b, lo, hi, slot if slot >= 0 else None))
            lo = hi
    return rounds


def gated_delta_rule_fla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, index: StateIndex
) -> Tensor:
    """`gated_delta_rule` (same arguments and result) through fla's chunk_gated_delta_rule, one call per round
    of segments; q and k are L2-normalised in fla's kernel (use_qk_l2norm_in_kernel) and scaled by Dk**-0.5."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    groups = v.shape[1] // k.shape[1]
    if groups > 1:  # fla's chunked kernel wants as many q/k heads as v heads (as transformers calls it)
        q, k = q.repeat_interleave(groups, dim=1), k.repeat_interleave(groups, dim=1)  # (N, Hv, Dk)
    h = read_states(state, index.read_slots)  # (B, Hv, Dk, Dv) float32: each request's state so far
    out = torch.empty_like(v)  # (N, Hv, Dv)
    device = v.device
    for segments in segment_rounds(index.query_start_loc, index.host_write_slots):
        bounds = [0]
        for s in segments:
            bounds.append(bounds[-1] + s.end - s.start)
        # the round's tokens, segment after segment; None when that is the whole step in order (no gather)
        tokens = None
        if bounds[-1] < v.shape[0]:
            tokens = torch.cat([torch.arange(s.start, s.end) for s in segments]).to(device)

        def packed(x: Tensor, tokens: Tensor | None = tokens) -> Tensor:  # (N, ...) -> (1, T, ...)
            return (x if tokens is None else x.index_select(0, tokens))[None]

        requests = torch.tensor([s.request for s in segments], device=device)
        seg_out, final = chunk_gated_delta_rule(
            packed(q),
            packed(k),
            packed(v),
            g=packed(g),
            beta=packed(beta),
            scale=k.shape[-1] ** -0.5,
            initial_state=h.index_select(0, requests),
            output_final_state=True,
            cu_seqlens=torch.tensor(bounds, device=device),
            use_qk_l2norm_in_kernel=True,
        )  # (1, T, Hv, Dv), (R, Hv, Dk, Dv) float32
        if tokens is None:
            out.copy_(seg_out[0])
        else:
            out.index_copy_(0, tokens, seg_out[0])
        final = final.float()
        h.index_copy_(0, requests, final)
        stored = [(r, s.slot) for r, s in enumerate(segments) if s.slot is not None]
        if stored:
            rows, slots = (torch.tensor(column, device=device) for column in zip(*stored, strict=True))
            state.index_copy_(0, slots, final.index_select(0, rows))
    return out
