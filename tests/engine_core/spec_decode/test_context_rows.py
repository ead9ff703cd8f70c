"""A drafter's context rows: made from requests' block tables they land in the slots the step's own KV slot
mapping gives those tokens; a step's rows keep only the requests that draft, in order; a drafter refuses
rows outside its cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from openinfer.engine_core.spec_decode.drafter import ContextRows, ContextUpdate, context_rows
from openinfer.engine_core.spec_decode.pending_context import step_rows
from openinfer.engine_core.worker.step_batch import SeqChunk, step_of_chunks

PAGE = 4
# three requests: 3 new tokens at position 5 (table [7, 2]), 1 at position 9 (table [0, 4, 6]), 2 at 0 ([3])
CHUNKS = [
    SeqChunk([11, 12, 13], 5, [7, 2]),
    SeqChunk([14], 9, [0, 4, 6]),
    SeqChunk([15, 16], 0, [3]),
]
WIDTH = 3


def aux() -> torch.Tensor:
    """(6, WIDTH): row r holds r in every column, so a row's origin shows."""
    return torch.arange(6, dtype=torch.float32)[:, None].expand(6, WIDTH).contiguous()


def test_rows_from_block_tables_are_the_steps_slots() -> None:
    """context_rows over the requests' tables gives each token the slot and position step_of_chunks gives it
    (slot = table[pos // 4] * 4 + pos % 4: 5 -> 2 * 4 + 1 = 9)."""
    step = step_of_chunks(CHUNKS, PAGE)
    starts = np.cumsum([0] + [len(c.token_ids) for c in CHUNKS])
    updates = [
        ContextUpdate(c.block_ids, c.start_pos, aux()[a:b])
        for c, a, b in zip(CHUNKS, starts, starts[1:], strict=False)
    ]
    rows = context_rows(updates, PAGE)
    assert rows.positions.tolist() == step.positions.tolist() == [5, 6, 7, 9, 0, 1]
    assert rows.slots.tolist() == step.slot_mapping.tolist() == [9, 10, 11, 25, 12, 13]
    assert torch.equal(rows.hidden, aux())
    with pytest.raises(ValueError, match="1 blocks of 4 cannot hold positions 3..5"):
        context_rows([ContextUpdate([3], 3, aux()[:2])], PAGE)


def test_a_steps_rows_keep_the_drafting_requests_in_order() -> None:
    """Every request drafting: the step's rows as they are; the first and last only: rows 0-2 and 4-5, at
    their positions and slots; ContextRows.join puts parts one after another."""
    step = step_of_chunks(CHUNKS, PAGE)
    whole = step_rows(aux(), step, [(0, 3), (3, 4), (4, 6)])
    assert torch.equal(whole.hidden, aux()) and whole.slots.tolist() == step.slot_mapping.tolist()
    some = step_rows(aux(), step, [(0, 3), (4, 6)])
    assert some.hidden[:, 0].tolist() == [0, 1, 2, 4, 5]
    assert some.positions.tolist() == [5, 6, 7, 0, 1] and some.slots.tolist() == [9, 10, 11, 12, 13]
    joined = ContextRows.join([some, whole])
    assert joined.hidden.shape == (11, WIDTH) and joined.slots.tolist()[5:] == step.slot_mapping.tolist()
