"""A block drafter's numbers, never trusted to be finite: finite weights can still overflow at run time (huge
fc or Markov weights, extreme activations), and a drafter's numbers must never fail a request.

Speculation is verified by the target, so what a non-finite value says is only "this draft is worthless":

- a slot's confidence reads as 0 where it, or the slot's logits (``finite_slots``), went NaN or infinite
  (``DFlashDrafter._drafts``): with ``--confidence-threshold`` the round verifies the drafts before that
  slot only; with adaptive verification its survival is 0 from there on; the counters and the spec log
  count the 0 they are given;
- logits become finite (``finite_logits``) wherever a distribution is made of them, so a sampled draft is a
  real token drawn from a real distribution q, which rejection sampling divides by; a greedy draft is the
  argmax, a valid token id whatever the logits hold. The target's verification keeps the output lossless.

All of it on the device with no host sync of its own: each draft row says whether its numbers were finite
(``DeviceDrafts.finite``, also from the draft CUDA graphs), read back in the step's one copy with the drafts;
the log gets a line at most every ``LOG_INTERVAL_S`` seconds (:class:`NonFiniteLog`).
"""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

logger = logging.getLogger("openinfer.engine")

# |logit| after finite_logits: Qwen3-class logits are below ~100, and a bound of 1e4 divided by the lowest
# sampling temperature (1e-5: Request.temperature) stays far inside float32, so softmax never sees inf.
LOGIT_LIMIT = 1e4
LOG_INTERVAL_S = 60.0  # at most one line this often about a drafter's non-finite numbers


def finite_logits(logits: Tensor) -> Tensor:
    """``logits`` with NaN read as 0 and every value clamped to [-LOGIT_LIMIT, LOGIT_LIMIT] (the same shape)."""
    return torch.nan_to_num(logits, nan=0.0).clamp(-LOGIT_LIMIT, LOGIT_LIMIT)


def finite_slots(logits: Tensor) -> Tensor:
    """(B, n, vocab) draft logits -> (B, n) bool: whether each slot's logits hold no NaN, no +inf and not
    only -inf (what makes its softmax NaN); one reduction over the vocabulary."""
    return logits.amax(dim=-1).isfinite()


class NonFiniteLog:
    """A drafter's rows of non-finite numbers, told in the log at a bounded rate (see above)."""

    def __init__(self, name: str) -> None:
        self.name = name  # the drafter, in the log line
        self.num_rows = 0  # draft rows whose numbers were not finite, so far
        self._logged_rows = 0  # num_rows at the last line logged
        self._logged_at: float | None = None  # time.monotonic() of the last line logged

    def note(self, finite: list[bool]) -> None:
        """One step's rows: whether each one's numbers were finite."""
        self.num_rows += finite.count(False)
        if self.num_rows == self._logged_rows:
            return
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= LOG_INTERVAL_S:
            logger.warning(
                "drafter %s produced NaN or infinite values in %d draft(s) since the last such line: those "
                "drafts read as confidence 0 and finite logits, and the target's verification keeps the "
                "output exact, but they are worthless; check the drafter's weights and config",
                self.name, self.num_rows - self._logged_rows,
            )  # fmt: skip
            self._logged_at, self._logged_rows = now, self.num_rows
