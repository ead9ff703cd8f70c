"""Per step, what vLLM's logits processors do to each sampling request's logits rows (applied on the device by
``kernels/logits_processors.py``), with vLLM's semantics:

- bad words: a word's last token is masked where the output history ends with the word's other tokens (a
  one-token word: always); the history is output tokens only, as in vLLM;
- min_tokens: while fewer than min_tokens tokens are out, the request's stop tokens are masked (its
  stop_token_ids, and EOS unless ignore_eos: exactly the tokens that would end it);
- logit_bias: added to the raw logits;
- repetition penalty over prompt and output tokens, frequency and presence penalties over output tokens.

A request's row j verifies its draft j, after drafts 0..j-1: its output history includes them (for the
counts, the min_tokens count and the bad-word context), so each draft is checked against the distribution it
would have been sampled from, and greedy speculation is lossless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from openinfer.engine_core.sample.penalty_pairs import PenaltyPairs
from openinfer.engine_core.scheduler_output import ScheduledRequest
from openinfer.kernels.logits_processors import LogitsPlan, apply_plan
from openinfer.protocol import SamplingParams


def plan_logits(sampling: Sequence[ScheduledRequest], starts: Sequence[int]) -> LogitsPlan | None:
    """The plan for one step's sampling requests (request i has len(drafts) + 1 logits rows from
    ``starts[i]`` on), or None when none of them uses a logits processor: such a step costs one pass over its
    requests."""
    planner: _Planner | None = None
    for s, row in zip(sampling, starts, strict=True):
        if s.request.processes_logits:
            planner = planner or _Planner()
            planner.add(s, row)
    return planner.plan() if planner is not None else None


def processed_logits(logits: Tensor, sampling: Sequence[ScheduledRequest], starts: Sequence[int]) -> Tensor:
    """``logits`` (rows as ``plan_logits`` says) after the step's logits processors: the tensor itself,
    processed in place, or a processed copy when some request asks for logprobs (those are of the raw
    logits, vLLM's default); untouched when no processor applies."""
    plan = plan_logits(sampling, starts)
    if plan is None:
        return logits
    keep_raw = any(s.request.sampling_params.logprobs is not None for s in sampling)
    return _applied(logits.clone() if keep_raw else logits, plan)


@torch.inference_mode()  # the runner's logits are inference tensors: updated in place under it
def _applied(logits: Tensor, plan: LogitsPlan) -> Tensor:
    apply_plan(logits, plan)
    return logits


def check_logits_params(params: SamplingParams, vocab_size: int) -> str | None:
    """What is wrong with a request's logits-processor parameters (vLLM's ranges) or its stop token ids (its
    min_tokens masks them), or None."""
    for name, value in (
        ("presence_penalty", params.presence_penalty),
        ("frequency_penalty", params.frequency_penalty),
    ):
        if not -2.0 <= value <= 2.0:
            return f"{name} must be in [-2, 2], got {value}"
    if not (math.isfinite(params.repetition_penalty) and params.repetition_penalty > 0):
        return f"repetition_penalty must be a finite number > 0, got {params.repetition_penalty}"
    if not 0.0 <= params.min_p <= 1.0:
        return f"min_p must be in [0, 1], got {params.min_p}"
    if not 0 <= params.min_tokens <= params.max_tokens:
        return f"min_tokens must be in [0, max_tokens={params.max_tokens}], got {params.min_tokens}"
    if any(not 0 <= t < vocab_size for t in params.stop_token_ids):  # min_tokens masks them
        return f"stop_token_ids must be in [0, {vocab_size})"
    if any(not 0 <= t < vocab_size for t in params.logit_bias):
        return f"logit_bias token ids must be in [0, {vocab_size})"
    if any(not math.isfinite(v) for v in params.logit_bias.values()):
        return "logit_bias values must be finite numbers"
    if any(not word or any(not 0 <= t < vocab_size for t in word) for word in params.bad_words_token_ids):
        return f"bad_words_token_ids must be non-empty sequences of token ids in [0, {vocab_size})"
    return None


class _Planner:
    """Collects one step's (row, token) pairs, then packs them into a LogitsPlan."""

    def __init__(self) -> None:
        self.mask_rows: list[int] = []
        self.mask_tokens: list[int] = []
        self.bias_rows: list[int] = []
        self.bias_tokens: list[int] = []
        self.bias_values: list[float] = []
        self.penalties = PenaltyPairs()

    def add(self, scheduled: ScheduledRequest, first_row: int) -> None:
        """The request's rows first_row .. first_row + len(drafts): row j follows drafts[:j]. Its history is
        what it held when scheduled (``scheduled.num_tokens``), whatever the step has done since."""
        request, drafts = scheduled.request, scheduled.spec_token_ids
        params = request.sampling_params
        num_rows = len(drafts) + 1
        num_output = scheduled.num_output_tokens
        # min_tokens: row j samples output token num_output + j
        for j in range(min(num_rows, max(params.min_tokens - num_output, 0))):
            self.mask_rows += [first_row + j] * len(request.stop_ids)
            self.mask_tokens += request.stop_ids
        if params.bad_words_token_ids:
            self._bad_words(params.bad_words_token_ids, scheduled, first_row)
        if params.logit_bias:
            for j in range(num_rows):
                self.bias_rows += [first_row + j] * len(params.logit_bias)
                self.bias_tokens += params.logit_bias.keys()
                self.bias_values += params.logit_bias.values()
        if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
            self.penalties.add(scheduled, first_row)

    def _bad_words(self, words: list[list[int]], scheduled: ScheduledRequest, first_row: int) -> None:
        longest_prefix = max(len(word) for word in words) - 1
        end = scheduled.num_tokens
        drafts = scheduled.spec_token_ids
        tail = scheduled.request.all_token_ids[end - min(longest_prefix, scheduled.num_output_tokens) : end]
        context = [*tail, *drafts]  # row j's history ends at context[len(tail) + j]
        for j in range(len(drafts) + 1):
            end = len(tail) + j
            for word in words:
                prefix = len(word) - 1  # the history must hold it: never reaching into the prompt
                if prefix <= end and context[end - prefix : end] == word[:-1]:
                    self.mask_rows.append(first_row + j)
                    self.mask_tokens.append(word[-1])

    def plan(self) -> LogitsPlan | None:
        if not self.mask_rows and not self.bias_rows and not self.penalties.lengths:
            return None  # e.g. min_tokens reached and nothing else asked
        rows, tokens, scales, offsets = self.penalties.pairs()
        return LogitsPlan(
            _ints(self.mask_rows), _ints(self.mask_tokens), _ints(self.bias_rows), _ints(self.bias_tokens),
            np.array(self.bias_values, dtype=np.float32), rows, tokens, scales, offsets,
        )  # fmt: skip


def _ints(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)
