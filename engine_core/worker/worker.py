"""The worker: runs the scheduler's decision through the model and samples it, one frozen output per step."""

from __future__ import annotations

from collections.abc import Sequence

from openinfer.engine_core.core.scheduler_output import SchedulerOutput
from openinfer.engine_core.sample.sampler import Sampler
from openinfer.engine_core.worker.executor import ModelExecutor
from openinfer.engine_core.worker.input_batch import InputBatch
from openinfer.engine_core.worker.runner_output import EMPTY_OUTPUT, ModelRunnerOutput


class Worker:
    """Owns the step's inputs (the persistent :class:`InputBatch`), the model executor it is given and the
    :class:`Sampler`; the engine core hands it each decision and books what it returns."""

    def __init__(
        self, runner: ModelExecutor, sampler: Sampler, max_num_seqs: int, max_model_len: int
    ) -> None:
        self.runner = runner
        self.sampler = sampler
        # Drafts never run past the model length, so a row holds max_model_len tokens.
        self.input_batch = InputBatch(max_num_seqs, max_model_len, runner.block_size)

    def execute(self, decided: SchedulerOutput, aux_layer_ids: Sequence[int] = ()) -> ModelRunnerOutput:
        """Run the decided step and sample it: tokens and logprobs per sampling request, and the hidden states
        of ``aux_layer_ids`` at every token when a drafter reads them."""
        self.input_batch.release(decided)
        if not decided.scheduled:
            return EMPTY_OUTPUT
        forward = self.runner.execute(self.input_batch.step_of(decided.scheduled), aux_layer_ids)
        sampled = self.sampler(forward.logits, decided)
        return ModelRunnerOutput(sampled.sampled, sampled.logprobs, forward.aux)
