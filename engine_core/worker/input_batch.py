"""The running requests' tokens and block tables as persistent arrays, one row per request (vLLM's
persistent batch): a step's inputs are gathered from them in a few vectorised operations, and only what
changed is written between steps.

A row holds its request's tokens (prompt and outputs, then the pending drafts past them) and its block table.
What keeps it true, and who writes it:

- ``add`` (the request is first scheduled, or again after a preemption) writes every token and the table;
- ``step_of`` (before the step) writes the tokens the request gained since (its accepted drafts are already
  in place: only its last token is new), its drafts after its last token, and a table whose length changed
  since it was written;
- ``release`` (before the step) frees the rows of the requests that ended or were preempted since the last
  step, and marks the tables the KV manager cut short (a cut table may grow back to the same length with
  other blocks) to be rewritten.

A hybrid model's rows also say where each request's state is (``states``, its StateGeometry): its state group
(the KV manager's, written by ``add``) and the chunk its last step ran (start, length), from which the next
step finds the slot holding the state at its start: a chunk of q tokens keeps the state after each of its last
min(q, group size) tokens, in its group's slots 0, 1, ..., so the state after the tokens the step verified is
in one of them (a verification's q is at most the group size). A request admitted on a prefix hit starts from
the hit's prefix state slot. A step that keeps a prefix state (``ScheduledRequest.state_captures``) has the
token before its position write it into the prefix slot, or, when that token's state goes to a group slot
already, copies it there after the forward (``StepBatch.state_copies``).

The rows are the input batch's own record (``Request`` knows nothing of them): whether a request still runs
is its status, never whether it holds a row.
"""

from __future__ import annotations

import numpy as np

from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.request import Request
from openinfer.engine_core.scheduler_output import ScheduledRequest, SchedulerOutput
from openinfer.engine_core.worker.step_batch import Int64s, StepBatch, expand_runs


class InputBatch:
    def __init__(
        self, max_num_seqs: int, max_tokens: int, block_size: int, states: StateGeometry | None = None
    ) -> None:
        """Rows for ``max_num_seqs`` requests of up to ``max_tokens`` tokens each, drafts included; ``states``
        for a hybrid model's."""
        self.block_size = block_size
        self.states = states
        self.state_group_size = states.group_size if states is not None else 0
        # each row's state group, the slot holding the state at its first start (-1: none, it starts at 0),
        # and the start and length of the chunk its last step ran (start -1: none yet)
        self.state_group = np.zeros(max_num_seqs, dtype=np.int64)
        self.start_slot = np.full(max_num_seqs, -1, dtype=np.int64)
        self.last_start = np.full(max_num_seqs, -1, dtype=np.int64)
        self.last_query = np.zeros(max_num_seqs, dtype=np.int64)
        self.token_ids = np.zeros((max_num_seqs, max_tokens), dtype=np.int64)
        self.block_tables = np.zeros((max_num_seqs, -(-max_tokens // block_size)), dtype=np.int64)
        self.num_blocks = np.zeros(max_num_seqs, dtype=np.int64)  # -1: stale, rewritten when next scheduled
        self.num_written = [0] * max_num_seqs  # each row's tokens of request.all_token_ids written
        self.rows: dict[Request, int] = {}
        self._free_rows = list(range(max_num_seqs - 1, -1, -1))

    def add(self, request: Request) -> int:
        """Give ``request`` a row and write its tokens and block table there."""
        self.rows[request] = row = self._free_rows.pop()
        self.token_ids[row, : len(request.all_token_ids)] = request.all_token_ids
        self.num_written[row] = len(request.all_token_ids)
        self._write_table(row, request.block_ids)
        if self.states is not None:
            if request.state_group is None:
                raise ValueError(f"request {request.request_id} runs on a hybrid model without a state group")
            self.state_group[row] = request.state_group
            hit = request.prefix_state
            self.start_slot[row] = -1 if hit is None else self.states.prefix_slot(hit)
            self.last_start[row] = -1
        return row

    def remove(self, request: Request) -> None:
        row = self.rows.pop(request, None)
        if row is not None:
            self._free_rows.append(row)

    def release(self, decided: SchedulerOutput) -> None:
        """Free the rows of the requests that ended or were preempted since the last step; mark the tables
        the KV manager cut short for rewriting."""
        for request in decided.finished:
            self.remove(request)
        for request in decided.preempted:
            self.remove(request)
        for request in decided.cut:
            row = self.rows.get(request)
            if row is not None:
                self.num_blocks[row] = -1

    def _write_table(self, row: int, block_ids: list[int]) -> None:
        self.block_tables[row, : len(block_ids)] = block_ids
        self.num_blocks[row] = len(block_ids)

    def step_of(self, scheduled: list[ScheduledRequest]) -> StepBatch:
        """The inputs of the scheduled step, after bringing its requests' rows up to date: a row for each
        request scheduled for the first time (or again after a preemption), the tokens it gained, the drafts
        it verifies, the tables the scheduler grew. One pass over the requests; the rest is vectorised over
        their rows."""
        facts: list[int] = []  # (row, start, query length, logits wanted) of each request, flat
        rows: list[int] = []  # (row, position, token) of every token to write
        positions: list[int] = []
        tokens: list[int] = []
        table_lens = self.num_blocks.tolist()  # one read of the numpy array, not one per request
        num_written, row_of = self.num_written, self.rows
        captures: list[tuple[int, int, int]] = []  # (chunk, position, prefix state slot) of kept states
        for chunk, (request, start, num_new, drafts, samples, *_, kept) in enumerate(scheduled):
            if kept:  # a hybrid model's prefix states (rare: one every prefix interval)
                captures += ((chunk, position, slot) for position, slot in kept)
            row = row_of.get(request)
            if row is None:
                row = self.add(request)
                table_lens[row] = len(request.block_ids)
            block_ids = request.block_ids
            if len(block_ids) != table_lens[row]:  # the scheduler grew the table (or cut it)
                self._write_table(row, block_ids)
            num_tokens = start + num_new  # the request's tokens when scheduled
            first = num_written[row]
            if first + 1 == num_tokens:  # the common case: the token it sampled last step
                rows.append(row)
                positions.append(first)
                tokens.append(request.all_token_ids[first])
            elif first < num_tokens:
                rows += [row] * (num_tokens - first)
                positions += range(first, num_tokens)
                tokens += request.all_token_ids[first:num_tokens]
            num_written[row] = num_tokens
            if drafts:
                rows += [row] * len(drafts)
                positions += range(num_tokens, num_tokens + len(drafts))
                tokens += drafts
            facts += (row, start, num_new + len(drafts), 1 + len(drafts) if samples else 0)
        if rows:
            self.token_ids[rows, positions] = tokens
        return self.step_batch(np.array(facts, dtype=np.int64).reshape(len(scheduled), 4), captures)

    def step_batch(self, facts: Int64s, captures: list[tuple[int, int, int]] | None = None) -> StepBatch:
        """The step of B requests, ``facts`` (B, 4): each one's row, the position of its first token run
        (tokens before it are cached), how many tokens it runs, and for how many of its last it wants logits;
        ``captures``, a hybrid model's prefix states to keep: (chunk, position, prefix state index)."""
        rows, starts, query_lens, num_logits = facts.T
        block_size = self.block_size
        longest_query = int(query_lens.max())
        if longest_query == 1:  # all decodes: one token each, at its request's start
            chunk_of, token_rows, positions = None, rows, starts
        else:
            chunk_of, positions = expand_runs(starts, query_lens)  # (N,) each: its request, its position
            token_rows = rows[chunk_of]
        num_blocks = self.num_blocks[rows]
        seq_lens = starts + query_lens
        slots = self.block_tables[token_rows, positions // block_size] * block_size + positions % block_size
        state_read = state_write = state_copies = None
        if self.states is not None:
            state_read, state_write = self._state_slots(rows, starts, query_lens, chunk_of, positions)
            if captures:
                state_copies = self._capture(captures, rows, starts, query_lens, state_write)
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
            state_read=state_read,
            state_write=state_write,
            state_copies=state_copies,
        )

    def _state_slots(
        self, rows: Int64s, starts: Int64s, query_lens: Int64s, chunk_of: Int64s | None, positions: Int64s
    ) -> tuple[Int64s, Int64s]:
        """The slot each chunk's state starts from (-1: zeros, at position 0) and the slot each token's state
        is kept in (-1: none), ``chunk_of`` (N,) being each token's chunk (None: one token each); then the
        rows remember the chunks for the next step."""
        size = self.state_group_size
        base = self.state_group[rows] * size  # (B,) each request's slot 0
        last_start, last_query = self.last_start[rows], self.last_query[rows]
        # the state at `start` is the one kept after token start - 1 of the last chunk, which kept its last
        # min(q, size) tokens' states in slots 0, 1, ...
        index = starts - 1 - last_start - (last_query - np.minimum(last_query, size))
        first = last_start < 0  # (B,) its first step since admission: from its hit's slot, or from zeros
        state_read = np.where(first, self.start_slot[rows], base + index)
        lost = (starts > 0) & np.where(first, state_read < 0, (index < 0) | (index >= size))
        if lost.any():
            bad = int(np.argmax(lost))
            raise AssertionError(
                f"no state slot holds position {starts[bad]} (last chunk: {last_start[bad]}, {last_query[bad]})"
            )
        state_read = np.where(starts > 0, state_read, -1)
        kept_from = query_lens - np.minimum(query_lens, size)  # (B,) the first token whose state is kept
        if chunk_of is None:
            chunk_of = np.arange(len(rows))
        write_index = positions - starts[chunk_of] - kept_from[chunk_of]  # (N,) token's place from kept_from
        state_write = np.where(write_index >= 0, base[chunk_of] + write_index, -1)
        self.last_start[rows], self.last_query[rows] = starts, query_lens
        return state_read, state_write

    def _capture(
        self,
        captures: list[tuple[int, int, int]],
        rows: Int64s,
        starts: Int64s,
        query_lens: Int64s,
        state_write: Int64s,
    ) -> Int64s | None:
        """Keep each captured prefix state, the state after token position - 1: that token writes it into the
        prefix slot (``state_write``, in place), or, when the token's state goes to a group slot already, it
        is copied from there after the forward: the (source, destination) slot pairs, or None."""
        assert self.states is not None
        size, states = self.state_group_size, self.states
        token_starts = np.cumsum(query_lens) - query_lens  # (B,) each chunk's first token
        copies = []
        for chunk, position, index in captures:
            offset = position - 1 - int(starts[chunk])  # the token's place in its chunk
            kept_from = int(query_lens[chunk]) - min(int(query_lens[chunk]), size)
            if offset >= kept_from:
                group_slot = int(self.state_group[rows[chunk]]) * size + offset - kept_from
                copies.append((group_slot, states.prefix_slot(index)))
            else:
                state_write[int(token_starts[chunk]) + offset] = states.prefix_slot(index)
        return np.array(copies, dtype=np.int64).reshape(-1, 2) if copies else None
