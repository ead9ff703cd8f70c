"""The worker: runs the scheduler's decision through the model, samples it and lets the drafter propose, all on
the device; then reads the step back to the host once, one frozen output per step."""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.sample.sampler import Sampler
from openinfer.engine_core.scheduler_output import SchedulerOutput
from openinfer.engine_core.worker.executor import ModelExecutor, reachable_positions
from openinfer.engine_core.worker.input_batch import InputBatch
from openinfer.engine_core.worker.read_back import read_back
from openinfer.engine_core.worker.runner_output import EMPTY_OUTPUT, DeviceDrafts, ModelRunnerOutput
from openinfer.engine_core.worker.step_batch import StepBatch
from openinfer.kernels.verification import Verified


class StepDrafter(Protocol):
    """What the worker asks of the loaded drafter (``SpecDecoder``) before the step's read-back."""

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """The target layers whose hidden states the drafter reads; () when none."""
        ...

    def draft_on_device(
        self, decided: SchedulerOutput, verified: Verified | None, aux: Tensor | None, step: StepBatch
    ) -> DeviceDrafts | None:
        """Take the step's context and propose from its device tokens: P requests' drafts, or None."""
        ...


class Worker:
    """Owns the step's inputs (the persistent :class:`InputBatch`), the model executor it is given and the
    :class:`Sampler`; the engine core hands it each decision and books what it returns."""

    def __init__(
        self,
        runner: ModelExecutor,
        sampler: Sampler,
        max_num_seqs: int,
        max_model_len: int,
        states: StateGeometry | None = None,
    ) -> None:
        self.runner = runner
        self.sampler = sampler
        # Drafts never run past the model length nor the positions the KV cache can hold (rows of a config's
        # 2^31 max_position_embeddings were 1 TiB).
        row_tokens = reachable_positions(max_model_len, runner.num_kv_blocks, runner.block_size)
        self.input_batch = InputBatch(max_num_seqs, row_tokens, runner.block_size, states)

    def execute(self, decided: SchedulerOutput, drafter: StepDrafter | None = None) -> ModelRunnerOutput:
        """Run the decided step, sample it and (when a drafter is given) let it take the step's hidden states
        and propose on the device; then read it all back at once: one device-to-host copy per step."""
        self.input_batch.release(decided)
        if not decided.scheduled:
            return EMPTY_OUTPUT
        aux_layer_ids = drafter.aux_layer_ids if drafter is not None else ()
        step = self.input_batch.step_of(decided.scheduled)
        forward = self.runner.execute(step, aux_layer_ids)
        sampled = self.sampler(forward.logits, decided)
        drafts = None
        if drafter is not None:
            verified = sampled.verified if sampled is not None else None
            drafts = drafter.draft_on_device(decided, verified, forward.aux, step)
        if sampled is None:  # no request samples (prefill chunks only): nothing to read
            return EMPTY_OUTPUT
        verified = sampled.verified
        table = sampled.logprobs.table if sampled.logprobs is not None else None
        # The step's one device-to-host copy.
        ids, confidence, finite = (
            (drafts.draft_ids, drafts.confidence, drafts.finite) if drafts is not None else (None, None, None)
        )
        counts, tokens, logprob_values, draft_ids, draft_confidence, draft_finite = read_back(
            [verified.num_accepted, verified.tokens, table, ids, confidence, finite]
        )
        assert tokens is not None
        token_ids, logprobs = sampled.read(counts, tokens, logprob_values)
        if ids is None or draft_ids is None:
            return ModelRunnerOutput(token_ids, logprobs)
        width = ids.shape[1]
        return ModelRunnerOutput(
            token_ids,
            logprobs,
            _rows(draft_ids, width),
            _rows(draft_confidence or [], width),
            [bool(f) for f in draft_finite or []],
        )


def _rows(values: list[Any], width: int) -> list[list[Any]]:
    """Flat read-back values as rows of ``width``."""
    return [values[i : i + width] for i in range(0, len(values), width)]
