"""A drafter's context between proposals: the target's hidden states of the steps that proposed nothing
(the drafting policy paused proposing), kept in order and written in one batch before the next proposal
reads them, or once PENDING_CONTEXT_ROWS positions are kept."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import torch
from torch import Tensor

from openinfer.engine_core.spec_decode.drafter import ContextRows, Drafter
from openinfer.engine_core.worker.step_batch import StepBatch

# A step that proposes nothing leaves its drafter-context rows to the next that does, up to this many.
PENDING_CONTEXT_ROWS = 4096


class PendingContext:
    """The rows kept for a drafter, in step order: their slots are their steps', so a later owner of a freed
    block writes after an earlier one, as if every step had written its own."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.rows: list[ContextRows] = []
        self.num_rows = 0  # positions kept

    def write(self, rows: ContextRows | None, now: bool) -> None:
        """Take a step's rows (None: the step has none); write everything kept when a proposal reads it next
        (``now``) or once PENDING_CONTEXT_ROWS are kept."""
        if rows is not None:
            self.rows.append(rows)
            self.num_rows += rows.hidden.shape[0]
        if self.rows and (now or self.num_rows >= PENDING_CONTEXT_ROWS):
            self.drafter.extend_context(ContextRows.join(self.rows))
            self.rows, self.num_rows = [], 0


def step_rows(aux: Tensor, step: StepBatch, rows: list[tuple[int, int]]) -> ContextRows:
    """The context rows of a step's token ``rows`` (start, stop), in order: aux (N, width) at the positions
    and KV slots the step ran them."""
    if len(rows) == 1 or all(a[1] == b[0] for a, b in pairwise(rows)):  # one run (every request drafts)
        start, stop = rows[0][0], rows[-1][1]
        return ContextRows(aux[start:stop], step.positions[start:stop], step.slot_mapping[start:stop])
    index = np.concatenate([np.arange(start, stop) for start, stop in rows])  # (n,)
    hidden = aux[torch.from_numpy(index).to(aux.device)]
    return ContextRows(hidden, step.positions[index], step.slot_mapping[index])
