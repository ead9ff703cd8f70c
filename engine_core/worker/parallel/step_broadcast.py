"""A step's decision as two int64 tensors, for the driver to broadcast to its tensor-parallel ranks once per
step: a fixed-size header (what comes, and the sizes) and one payload (the :class:`StepBatch`'s arrays end to
end, then the aux layer ids). No pickle: every field is an int64 array or an int."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from openinfer.engine_core.worker.step_batch import Int64s, StepBatch


class StepKind(enum.IntEnum):
    """What a header announces."""

    STEP = 1  # a payload follows: run it
    STOP = 2  # no payload: the engine is stopping, exit cleanly
    PING = 3  # no payload: the driver is idle and alive (a rank's wait for the next header stays bounded)


# The header's slots, in order (int64 each).
_KIND, _TOKENS, _CHUNKS, _WIDTH, _COPIES, _STATES, _AUX, _BLOCK, _MAX_QUERY, _MAX_SEQ, _EVERY_ROW, _SIZE = (
    range(12)
)
HEADER_LEN = 12
NO_COPIES = -1  # the header's copies slot when the step has no state_copies (0 would be an empty array)


@dataclass(frozen=True)
class StepMessage:
    """A header and its payload (None for STOP), both (length,) int64 CPU tensors."""

    header: Tensor  # (HEADER_LEN,)
    payload: Tensor | None  # (header[_SIZE],)


def bare_message(kind: StepKind) -> StepMessage:
    """A header without payload: STOP or PING."""
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    header[_KIND] = kind
    return StepMessage(header, None)


def pack_step(step: StepBatch, aux_layer_ids: Sequence[int]) -> StepMessage:
    """``step`` and the drafter's ``aux_layer_ids`` as a header and a payload."""
    has_states = step.state_read is not None and step.state_write is not None
    parts: list[Int64s] = [
        step.token_ids, step.positions, step.slot_mapping, step.context_lens, step.query_lens,
        step.num_logits, step.block_tables.reshape(-1), step.num_blocks,
    ]  # fmt: skip
    if step.state_read is not None and step.state_write is not None:
        parts += [step.state_read, step.state_write]
    if step.state_copies is not None:
        parts.append(step.state_copies.reshape(-1))
    parts.append(np.asarray(aux_layer_ids, dtype=np.int64))
    payload = np.concatenate(parts).astype(np.int64, copy=False)
    header = np.zeros(HEADER_LEN, dtype=np.int64)
    header[_KIND] = StepKind.STEP
    header[_TOKENS], header[_CHUNKS], header[_WIDTH] = (
        step.num_tokens,
        step.num_chunks,
        step.block_tables.shape[1],
    )
    header[_COPIES] = NO_COPIES if step.state_copies is None else len(step.state_copies)
    header[_STATES], header[_AUX], header[_BLOCK] = has_states, len(aux_layer_ids), step.block_size
    header[_MAX_QUERY], header[_MAX_SEQ] = step.max_query_len, step.max_seq_len
    header[_EVERY_ROW], header[_SIZE] = step.logits_for_every_token, len(payload)
    return StepMessage(torch.from_numpy(header), torch.from_numpy(payload))


def header_kind(header: Tensor) -> StepKind:
    """What a received header announces."""
    return StepKind(int(header[_KIND]))


def payload_size(header: Tensor) -> int:
    """How many int64 the payload a STEP header announces holds."""
    return int(header[_SIZE])


def unpack_step(header: Tensor, payload: Tensor) -> tuple[StepBatch, tuple[int, ...]]:
    """The step and aux layer ids :func:`pack_step` packed (the inverse: every array equal)."""
    h = [int(v) for v in header.tolist()]
    n, b, w, copies = h[_TOKENS], h[_CHUNKS], h[_WIDTH], h[_COPIES]
    sizes = [n, n, n, b, b, b, b * w, b]
    if h[_STATES]:
        sizes += [b, n]
    if copies != NO_COPIES:
        sizes.append(2 * copies)
    sizes.append(h[_AUX])
    flat = payload.numpy()
    if len(flat) != sum(sizes):
        raise ValueError(f"a step payload of {len(flat)} int64 does not match its header's {sum(sizes)}")
    arrays = np.split(flat, np.cumsum(sizes)[:-1])
    token_ids, positions, slots, context_lens, query_lens, num_logits, tables, num_blocks = arrays[:8]
    rest = arrays[8:]
    state_read = state_write = state_copies = None
    if h[_STATES]:
        state_read, state_write, *rest = rest
    if copies != NO_COPIES:
        state_copies = rest.pop(0).reshape(copies, 2)
    step = StepBatch(
        token_ids,
        positions,
        slots,
        context_lens,
        query_lens,
        num_logits,
        tables.reshape(b, w),
        num_blocks,
        h[_BLOCK],
        max_query_len=h[_MAX_QUERY],
        max_seq_len=h[_MAX_SEQ],
        logits_for_every_token=bool(h[_EVERY_ROW]),
        state_read=state_read,
        state_write=state_write,
        state_copies=state_copies,
    )
    return step, tuple(int(i) for i in rest[0])
