"""The sampler: one step's logits in, each sampling request's tokens (and logprobs) out.

Everything that turns logits into tokens happens here, in vLLM's order: grammar masks (logprobs see them, as
vLLM's do), then the logits processors (penalties, bias, bad words, min_tokens; logprobs stay raw), then
verification (greedy or rejection sampling) of every sampling request's drafts, then the logprobs of the
tokens kept. Rows are laid out once, by the scheduler's decision (``SchedulerOutput.logits_starts``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.engine_core.core.scheduler_output import ScheduledRequest, SchedulerOutput
from openinfer.engine_core.sample.logits_plan import processed_logits
from openinfer.engine_core.sample.step_logprobs import sampled_logprobs
from openinfer.engine_core.sample.structured_output import apply_grammars
from openinfer.kernels.sampling import SamplingBatch
from openinfer.kernels.verification import verify
from openinfer.protocol import TokenLogprobs


@dataclass(frozen=True)
class SamplerOutput:
    """Per sampling request of the decision, in order: the tokens to append (its accepted drafts, then one
    token of the target's) and their logprobs (None where it did not ask for them)."""

    sampled: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None]


class Sampler:
    """Samples one step's logits for the requests the scheduler decided; requests without a seed of their
    own draw from ``generator``."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, logits: Tensor, decided: SchedulerOutput) -> SamplerOutput:
        """``logits`` (decided.num_logits, V) float32, rows as ``decided`` lays them out; processed in place."""
        sampling, starts = decided.sampling, decided.logits_starts
        batch = self._sampling_batch(sampling, logits.shape[1])
        apply_grammars(logits, sampling, starts)
        processed = processed_logits(logits, sampling, starts)
        sampled = verify(processed, decided.drafts, batch, starts)
        return SamplerOutput(sampled, sampled_logprobs(logits, sampling, starts, sampled))

    def _sampling_batch(self, sampling: list[ScheduledRequest], vocab_size: int) -> SamplingBatch:
        """The sampling parameters of the requests that sample this step (one list when all are greedy)."""
        temperatures = [s.request.temperature for s in sampling]
        if not any(temperatures):
            return SamplingBatch.greedy(len(sampling), vocab_size)
        requests = [s.request for s in sampling]
        return SamplingBatch.build(
            temperatures,
            [r.sampling_params.top_k for r in requests],
            [r.sampling_params.top_p for r in requests],
            [r.generator or self.generator for r in requests],
            vocab_size=vocab_size,
            min_ps=[r.sampling_params.min_p for r in requests],
        )
