"""The running requests' tokens and block tables as persistent arrays, one row per request (vLLM's
persistent batch): a step's inputs are gathered from them in a few vectorised operations, and only what
changed is written between steps.

A row holds its request's tokens (prompt and outputs, then the pending drafts past them) and its block table.
What keeps it true, and who writes it:

- ``add`` (the request is first scheduled, or again after a preemption) writes every token and the table;
- ``write_drafts`` (before the step that verifies them) writes a request's drafts after its last token;
- ``append`` (after each step) writes each sampling request's last new token: its accepted drafts are
  already in place, its prefill tokens were written by ``add``;
- ``step_of`` (before the step) rewrites a table whose length changed since it was written, and
  ``trimmed`` records a table cut short (a cut keeps the blocks before it, so the length says it all);
- ``remove`` (the request finished or was preempted) frees the row.
"""

from __future__ import annotations

import numpy as np

from openinfer.engine_core.core.request import Request
from openinfer.engine_core.core.scheduler import ScheduledRequest
from openinfer.engine_core.worker.step_batch import Int64s, StepBatch, expand_runs


class InputBatch:
    def __init__(self, max_num_seqs: int, max_tokens: int, block_size: int) -> None:
        """Rows for ``max_num_seqs`` requests of up to ``max_tokens`` tokens each, drafts included."""
        self.block_size = block_size
        self.token_ids = np.zeros((max_num_seqs, max_tokens), dtype=np.int64)
        self.block_tables = np.zeros((max_num_seqs, -(-max_tokens // block_size)), dtype=np.int64)
        self.num_blocks = np.zeros(max_num_seqs, dtype=np.int64)
        self._free_rows = list(range(max_num_seqs - 1, -1, -1))

    def add(self, request: Request) -> None:
        """Give ``request`` a row and write its tokens and block table there."""
        request.row = row = self._free_rows.pop()
        self.token_ids[row, : len(request.all_token_ids)] = request.all_token_ids
        self._write_table(row, request.block_ids)

    def remove(self, request: Request) -> None:
        if request.row is not None:
            self._free_rows.append(request.row)
            request.row = None

    def write_drafts(self, scheduled: list[ScheduledRequest]) -> None:
        """Write the drafts each scheduled request verifies after its last token."""
        rows = [_row(s.request) for s in scheduled for _ in s.spec_token_ids]
        positions = [s.start + s.num_new_tokens + i for s in scheduled for i in range(len(s.spec_token_ids))]
        self.token_ids[rows, positions] = [t for s in scheduled for t in s.spec_token_ids]

    def append(self, rows: list[int], positions: list[int], tokens: list[int]) -> None:
        """Write tokens[i] at positions[i] of row rows[i]."""
        if rows:
            self.token_ids[rows, positions] = tokens

    def trimmed(self, request: Request) -> None:
        self.num_blocks[_row(request)] = len(request.block_ids)

    def _write_table(self, row: int, block_ids: list[int]) -> None:
        self.block_tables[row, : len(block_ids)] = block_ids
        self.num_blocks[row] = len(block_ids)

    def step_of(self, scheduled: list[ScheduledRequest]) -> StepBatch:
        """The inputs of the scheduled step, after bringing its requests' rows up to date: a row for each
        request scheduled for the first time (or again after a preemption), the drafts it verifies, the
        tables the scheduler grew. One pass over the requests; the rest is vectorised over their rows."""
        facts: list[tuple[int, int, int, int]] = []
        drafting: list[ScheduledRequest] = []
        written = self.num_blocks
        for s in scheduled:
            request = s.request
            if request.row is None:
                self.add(request)
            row = _row(request)
            if len(request.block_ids) != written[row]:  # the scheduler grew the table
                self._write_table(row, request.block_ids)
            num_drafts = len(s.spec_token_ids)
            if num_drafts:
                drafting.append(s)
            facts.append((row, s.start, s.num_new_tokens + num_drafts, 1 + num_drafts if s.samples else 0))
        if drafting:
            self.write_drafts(drafting)
        return self.step_batch(np.array(facts, dtype=np.int64).reshape(len(scheduled), 4))

    def step_batch(self, facts: Int64s) -> StepBatch:
        """The step of B requests, ``facts`` (B, 4): each one's row, the position of its first token run
        (tokens before it are cached), how many tokens it runs, and for how many of its last it wants logits."""
        rows, starts, query_lens, num_logits = facts.T
        num_reqs, block_size = len(rows), self.block_size
        longest_query = int(query_lens.max())
        if longest_query == 1:  # all decodes: one token each, at its request's start
            chunk_of, positions = np.arange(num_reqs), starts
        else:
            chunk_of, positions = expand_runs(starts, query_lens)  # (N,) each: its request, its position
        token_rows = rows[chunk_of]
        num_blocks = self.num_blocks[rows]
        seq_lens = starts + query_lens
        slots = self.block_tables[token_rows, positions // block_size] * block_size + positions % block_size
        return StepBatch(
            token_ids=self.token_ids[token_rows, positions],
            positions=positions,
            slot_mapping=slots,
            context_lens=starts,
            query_lens=query_lens,
            num_logits=num_logits,
            block_tables=self.block_tables[rows, : int(num_blocks.max())],
            num_blocks=num_blocks,
            block_size=block_size,
            max_query_len=longest_query,
            max_seq_len=int(seq_lens.max()),
            logits_for_every_token=bool((num_logits == query_lens).all()),
        )


def _row(request: Request) -> int:
    """The request's row; it must hold one (a request without one is not running)."""
    if request.row is None:
        raise ValueError(f"request {request.request_id!r} has no row in the input batch")
    return request.row
