"""The (row, token) pairs one step's penalties touch, for all penalised requests at once (a few dozen numpy
calls per step, whatever the batch): each row's distinct seen tokens, with the repetition scale and the
frequency/presence offset ``kernels/logits_processors.py`` applies.

Request b's row j verifies its draft j: its output history is b's output, then drafts[:j]; its seen tokens
are that history's, and b's prompt's when b has a repetition penalty (vLLM's semantics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from openinfer.engine_core.scheduler_output import ScheduledRequest

IntArray = NDArray[np.int64]
_KEY = 2**32  # key = request index * _KEY + token id: one sorted universe of (request, token) over the step


@dataclass
class PenaltyPairs:
    """Collects the penalised requests of a step (``add``), then computes their pairs (``pairs``)."""

    tokens: list[int] = field(default_factory=list)  # each request's prompt, output, drafts, back to back
    lengths: list[tuple[int, int, int]] = field(default_factory=list)  # (prompt, output, drafts) per request
    first_rows: list[int] = field(default_factory=list)
    values: list[tuple[float, float, float, bool]] = field(default_factory=list)  # presence, frequency,
    # repetition, and whether the prompt counts (a repetition penalty)

    def add(self, scheduled: ScheduledRequest, first_row: int) -> None:
        """The request's tokens as scheduled (prompt, output, drafts) and its rows from ``first_row`` on."""
        request, drafts = scheduled.request, scheduled.spec_token_ids
        params = request.sampling_params
        self.tokens += request.all_token_ids[: scheduled.num_tokens]
        self.tokens += drafts
        self.lengths.append((request.num_prompt_tokens, scheduled.num_output_tokens, len(drafts)))
        self.first_rows.append(first_row)
        repetition = params.repetition_penalty
        self.values.append((params.presence_penalty, params.frequency_penalty, repetition, repetition != 1.0))

    def pairs(self) -> tuple[IntArray, IntArray, NDArray[np.float32], NDArray[np.float32]]:
        """(Q,) logits rows, token ids, repetition scales and offsets of the distinct seen pairs."""
        if not self.lengths:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.float32)
        num_prompt, num_output, num_drafts = np.array(self.lengths, dtype=np.int64).T  # (R,) each
        presence, frequency, repetition, repeats = (np.array(c) for c in zip(*self.values, strict=True))
        num_requests = len(self.lengths)
        # Every token of every request, with its request, its position there and its kind (prompt 0,
        # output 1, draft 2).
        tokens = np.array(self.tokens, dtype=np.int64)  # (E,)
        num_tokens = num_prompt + num_output + num_drafts  # (R,)
        request = np.repeat(np.arange(num_requests), num_tokens)  # (E,)
        pos = np.arange(len(tokens)) - np.repeat(_starts(num_tokens), num_tokens)  # (E,)
        kind = (pos >= num_prompt[request]).astype(np.int64) + (pos >= (num_prompt + num_output)[request])
        counted = (kind > 0) | repeats[request]  # prompt tokens count only under a repetition penalty
        universe, key_of = np.unique(request[counted] * _KEY + tokens[counted], return_inverse=True)  # (U,)
        kind, request, pos = kind[counted], request[counted], pos[counted]
        # (U,) each key's count in its request's output
        base = np.bincount(key_of[kind == 1], minlength=len(universe)).astype(np.float32)
        in_prompt = np.zeros(len(universe), dtype=bool)
        in_prompt[key_of[kind == 0]] = True
        num_keys = np.bincount(universe // _KEY, minlength=num_requests)  # (R,) distinct tokens of each
        key_start = _starts(num_keys)  # (R,) its first key in the universe

        # Rows: request b has num_drafts[b] + 1; each row pairs with every key of its request.
        num_rows = num_drafts + 1
        row_request = np.repeat(np.arange(num_requests), num_rows)  # (P,)
        row_j = np.arange(len(row_request)) - np.repeat(_starts(num_rows), num_rows)  # (P,) j within request
        pairs_per_row = num_keys[row_request]  # (P,)
        pair_start = _starts(pairs_per_row)  # (P,) first pair of each row
        pair_row = np.repeat(np.arange(len(row_request)), pairs_per_row)  # (Q,)
        pair_key = key_start[row_request][pair_row] + np.arange(len(pair_row)) - pair_start[pair_row]  # (Q,)
        counts = base[pair_key]  # (Q,)

        # Draft i of request b counts at its rows j > i: one +1 per (draft, later row).
        is_draft = kind == 2
        draft_keys, draft_request = key_of[is_draft], request[is_draft]  # (D,)
        draft_i = pos[is_draft] - (num_prompt + num_output)[draft_request]  # (D,) i within its drafts
        later = num_drafts[draft_request] - draft_i  # (D,) rows after each draft
        which = np.repeat(np.arange(len(draft_keys)), later)
        j = draft_i[which] + 1 + np.arange(len(which)) - np.repeat(_starts(later), later)
        row = _starts(num_rows)[draft_request[which]] + j  # (C,) global row index
        np.add.at(counts, pair_start[row] + draft_keys[which] - key_start[draft_request[which]], 1.0)

        seen = (counts > 0) | in_prompt[pair_key]
        pair_row, pair_key, counts = pair_row[seen], pair_key[seen], counts[seen]
        owner = row_request[pair_row]
        offsets = frequency[owner] * counts + presence[owner] * (counts > 0)
        rows = np.array(self.first_rows, dtype=np.int64)[owner] + row_j[pair_row]
        return (
            rows,
            universe[pair_key] % _KEY,
            repetition[owner].astype(np.float32),
            offsets.astype(np.float32),
        )


def _starts(lengths: IntArray) -> IntArray:
    """Where each of consecutive segments of ``lengths`` starts."""
    return np.cumsum(lengths) - lengths
