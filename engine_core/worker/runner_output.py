"""What the worker hands back for one step, on the host and frozen: the sampled tokens, their logprobs and the
drafts proposed on the device (:class:`DeviceDrafts`, as the drafter leaves them), all read back in the step's one
device-to-host copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from torch import Tensor

from openinfer.protocol import TokenLogprobs


class DeviceDrafts(NamedTuple):
    """B requests' drafts proposed on the device, read back with the step."""

    draft_ids: Tensor  # (B, num_spec_tokens) int64 draft ids (greedy, or sampled from probs at T > 0)
    # (B, num_spec_tokens) float32 in (0, 1): each draft's estimated acceptance given the ones before it were
    # accepted (DSpark's confidence head); None for a drafter without one
    confidence: Tensor | None = None
    # (B, num_spec_tokens, vocab) float32: the distribution q each draft was drawn from (one-hot for a greedy
    # request's); None when every draft is greedy. Rejection sampling verifies against it.
    probs: Tensor | None = None
    # (B,) bool: whether every slot's logits (and confidence) were finite (draft_numbers.py); None for a drafter
    # that does not tell
    finite: Tensor | None = None


@dataclass(frozen=True)
class ModelRunnerOutput:
    """One step's result, in the decision's order (``SchedulerOutput``): the scheduler books it
    (``Scheduler.update_from_output``), the drafter reads its drafts (``SpecDecoder.propose``)."""

    # per sampling request: the tokens to append (its accepted drafts, then one of the target's)
    sampled: list[list[int]]
    # per sampling request: their logprobs (None where it did not ask for them)
    logprobs: list[list[TokenLogprobs] | None]
    # per request the drafter proposed for on the device (SpecDecoder's order), num_spec_tokens draft ids,
    # to be cut to what the request may verify; empty when the drafter proposes on the host
    draft_ids: list[list[int]] = field(default_factory=list)
    # per row of draft_ids, each draft's confidence (DSpark's confidence head); empty without one
    draft_confidence: list[list[float]] = field(default_factory=list)
    # per row of draft_ids, whether the drafter's numbers were finite (False: read as worthless drafts, logged);
    # empty when the drafter does not tell
    draft_finite: list[bool] = field(default_factory=list)


EMPTY_OUTPUT = ModelRunnerOutput([], [])
