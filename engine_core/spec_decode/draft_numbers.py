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

All of it on the device with no host sync of its own: each forward sets a device flag when it met a
non-finite value (``NonFiniteWatch.note``, also inside the draft CUDA graphs); the next step copies it to the
host without waiting and the one after reads the copy, which that step's read-back has waited for; the log
gets a line at most every ``LOG_INTERVAL_S`` seconds.
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


class NonFiniteWatch:
    """Whether a drafter's forwards met non-finite numbers, told in the log at a bounded rate (see above)."""

    def __init__(self, device: torch.device, name: str) -> None:
        self.name = name  # the drafter, in the log line
        # set on the device by the forwards since the last look; its copy on the host, as of that look
        self._seen = torch.zeros((), dtype=torch.bool, device=device)
        self._host = torch.zeros((), dtype=torch.bool, pin_memory=device.type == "cuda")
        self.num_steps = 0  # steps whose forwards met non-finite numbers, as far as the host has read
        self._logged_steps = 0  # num_steps at the last line logged
        self._logged_at: float | None = None  # time.monotonic() of the last line logged

    def note(self, finite: Tensor) -> None:
        """In a forward (a device op, captured in a CUDA graph too): ``finite`` (any shape, bool) all true or
        not."""
        self._seen |= ~finite.all()

    def look(self) -> None:
        """On the host, once a step before the drafter's forward is queued: count the flag copied at the last
        look (the copy has arrived: the read-back of that look's step waited for the device), log at the
        bounded rate, then queue a copy of what the forwards since then set and clear the flag behind it."""
        if bool(self._host):
            self.num_steps += 1
            now = time.monotonic()
            if self._logged_at is None or now - self._logged_at >= LOG_INTERVAL_S:
                logger.warning(
                    "drafter %s produced NaN or infinite values in %d step(s) since the last such line: those "
                    "drafts read as confidence 0 and finite logits, and the target's verification keeps the "
                    "output exact, but they are worthless; check the drafter's weights and config",
                    self.name, self.num_steps - self._logged_steps,
                )  # fmt: skip
                self._logged_at, self._logged_steps = now, self.num_steps
        self._host.copy_(self._seen, non_blocking=True)
        self._seen.zero_()
