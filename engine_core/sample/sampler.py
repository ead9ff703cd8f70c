"""The sampler: one step's logits in, each sampling request's tokens (and logprobs) out, on the device.

Everything that turns logits into tokens happens here, in vLLM's order: grammar masks (logprobs see them, as
vLLM's do), then the logits processors (penalties, bias, bad words, min_tokens; logprobs stay raw), then
verification (greedy or rejection sampling) of every sampling request's drafts, then the logprobs of the
verified tokens. Rows are laid out once, by the scheduler's decision (``SchedulerOutput.logits_starts``).
Nothing is read back here: the worker reads the output in the step's one read-back (``read``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.engine_core.sample.logits_plan import processed_logits
from openinfer.engine_core.sample.step_logprobs import StepLogprobs, step_logprobs
from openinfer.engine_core.sample.structured_output import apply_grammars
from openinfer.engine_core.scheduler_output import ScheduledRequest, SchedulerOutput
from openinfer.kernels.sampling import SamplingBatch
from openinfer.kernels.verification import Verified, verify_on_device
from openinfer.protocol import TokenLogprobs


@dataclass(frozen=True)
class SamplerOutput:
    """Per sampling request of the decision, on the device: its verified tokens and the logprobs table of
    those that asked for logprobs (None when none did)."""

    verified: Verified
    logprobs: StepLogprobs | None

    def read(
        self, counts: list[int] | None, tokens: list[int], table: list[float] | None
    ) -> tuple[list[list[int]], list[list[TokenLogprobs] | None]]:
        """The tokens and logprobs per sampling request, from the host copies of ``verified`` and the table."""
        sampled = self.verified.read(counts, tokens)
        if self.logprobs is None or table is None:
            return sampled, [None] * len(sampled)
        return sampled, self.logprobs.read(table, [len(t) for t in sampled], len(sampled))


class Sampler:
    """Samples one step's logits for the requests the scheduler decided; requests without a seed of their
    own draw from ``generator``."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, logits: Tensor, decided: SchedulerOutput) -> SamplerOutput | None:
        """``logits`` (decided.num_logits, V) float32, rows as ``decided`` lays them out; processed in place.
        None when no request samples this step."""
        sampling, starts = decided.sampling, decided.logits_starts
        if not sampling:
            return None
        batch = self._sampling_batch(sampling, logits.shape[1])
        apply_grammars(logits, sampling, starts)
        processed = processed_logits(logits, sampling, starts)
        probs = [s.request.spec_probs if s.spec_token_ids else None for s in sampling]
        verified = verify_on_device(processed, decided.drafts, batch, starts, probs)
        return SamplerOutput(verified, step_logprobs(logits, sampling, starts, verified.tokens))

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
