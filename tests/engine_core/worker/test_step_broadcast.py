"""A step's decision packed for the tensor-parallel ranks comes back equal: every array, size and flag, with
and without a hybrid model's state slots and copies, and the drafter's aux layer ids."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from openinfer.engine_core.worker.parallel.step_broadcast import (
    HEADER_LEN,
    StepKind,
    bare_message,
    header_kind,
    pack_step,
    payload_size,
    unpack_step,
)
from openinfer.engine_core.worker.step_batch import SeqChunk, StepBatch, step_of_chunks

# two chunks: a 5-token prefill over 2 blocks of 4, a 1-token decode at position 9 over 3 blocks
CHUNKS = [
    SeqChunk([5, 6, 7, 8, 9], 0, [3, 1], 1, state_slot=2),
    SeqChunk([42], 9, [0, 4, 2], 1, state_slot=0),
]


def assert_same_step(got: StepBatch, want: StepBatch) -> None:
    for field in dataclasses.fields(StepBatch):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == np.int64 and np.array_equal(a, b), field.name
        else:
            assert a == b, field.name


@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("copies", [None, np.array([[1, 5], [2, 6]], dtype=np.int64)])
@pytest.mark.parametrize("aux", [(), (0, 3, 1)])
def test_a_packed_step_unpacks_equal(states: bool, copies: np.ndarray | None, aux: tuple[int, ...]) -> None:
    """pack_step then unpack_step is the identity on the step and the aux layer ids."""
    step = step_of_chunks(CHUNKS if states else [dataclasses.replace(c, state_slot=None) for c in CHUNKS], 4)
    step = dataclasses.replace(step, state_copies=copies)
    message = pack_step(step, aux)
    assert message.header.shape == (HEADER_LEN,) and header_kind(message.header) is StepKind.STEP
    assert message.payload is not None and payload_size(message.header) == len(message.payload)
    got, got_aux = unpack_step(message.header, message.payload)
    assert_same_step(got, step)
    assert got_aux == aux


def test_bare_headers_carry_no_payload() -> None:
    """STOP and PING are a header alone."""
    for kind in (StepKind.STOP, StepKind.PING):
        message = bare_message(kind)
        assert header_kind(message.header) is kind and message.payload is None


def test_a_payload_that_does_not_match_its_header_is_refused() -> None:
    """A payload of another size than its header announces is an error, never a misread step."""
    message = pack_step(step_of_chunks(CHUNKS[:1], 4), ())
    assert message.payload is not None
    with pytest.raises(ValueError, match="does not match its header"):
        unpack_step(message.header, message.payload[:-1])
