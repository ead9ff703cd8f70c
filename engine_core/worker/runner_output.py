"""What the worker hands back for one step: the sampled tokens and what the drafter reads, frozen."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from openinfer.protocol import TokenLogprobs


@dataclass(frozen=True)
class ModelRunnerOutput:
    """One step's result, in the decision's order (``SchedulerOutput``): the scheduler books it
    (``Scheduler.update_from_output``), the drafter reads its hidden states."""

    # per sampling request: the tokens to append (its accepted drafts, then one of the target's)
    sampled: list[list[int]]
    # per sampling request: their logprobs (None where it did not ask for them)
    logprobs: list[list[TokenLogprobs] | None]
    # (decided.num_tokens, aux width): the target's hidden states at every token run, rows at
    # decided.token_starts; None when no drafter reads them
    aux: Tensor | None


EMPTY_OUTPUT = ModelRunnerOutput([], [], None)
