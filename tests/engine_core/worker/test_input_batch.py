"""The persistent input batch mirrors the requests: every step's inputs, gathered from its rows, pass the
runner's checks (which the engine's own steps skip) and equal the inputs built afresh from the scheduled
requests' own token lists and block tables (``step_of_chunks``), through chunked prefill, drafts, rejected
drafts' trims, preemption, aborts and finished requests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.process.engine_cli import load_runner
from openinfer.engine_core.scheduler_output import ScheduledRequest, SchedulerOutput
from openinfer.engine_core.testing.seq_chunks import SeqChunk, step_of_chunks
from openinfer.engine_core.worker.executor import ForwardOutput
from openinfer.engine_core.worker.fake_model_runner import FIRST_CYCLE_TOKEN
from openinfer.engine_core.worker.step_batch import StepBatch
from openinfer.protocol import EngineCoreRequest, SamplingParams

BLOCK_SIZE = 4


def expected_step(scheduled: list[ScheduledRequest]) -> StepBatch:
    chunks = [
        SeqChunk(
            s.token_ids, s.start, list(s.request.block_ids), 1 + len(s.spec_token_ids) if s.samples else 0
        )
        for s in scheduled
    ]
    return step_of_chunks(chunks, BLOCK_SIZE)


def assert_same_step(got: StepBatch, want: StepBatch) -> None:
    """Equal arrays, except table columns past a table's length (padding: zeros there, old blocks here)."""
    for field in fields(StepBatch):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if field.name == "block_tables":
            used = np.arange(b.shape[1]) < want.num_blocks[:, None]
            assert a.shape == b.shape and (a[used] == b[used]).all()
        elif isinstance(a, np.ndarray):
            assert a.tolist() == b.tolist(), field.name
        else:
            assert a == b, field.name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_step_equals_the_requests_own_inputs(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    config = EngineConfig(
        model_path=tmp_path,
        served_model_name="t",
        fake_model=True,
        num_kv_blocks=40,  # tight: long requests get preempted and recomputed
        block_size=BLOCK_SIZE,
        max_num_seqs=6,
        max_num_batched_tokens=24,  # long prompts are prefilled in chunks
        speculative=DrafterSpec("ngram", 3, prompt_lookup_min=1, prompt_lookup_max=3),
    )
    core = EngineCore(config, load_runner(config))
    steps: list[tuple[StepBatch, StepBatch]] = []
    decided: list[SchedulerOutput] = []
    execute, schedule = core.runner.execute, core.scheduler.schedule

    def checked_execute(step: StepBatch, aux_layer_ids: Sequence[int] = ()) -> ForwardOutput:
        assert isinstance(step, StepBatch)
        step.check(core.runner.model_config.max_position_embeddings, core.runner.num_kv_blocks)
        steps.append((step, expected_step(decided[-1].scheduled)))
        return execute(step, aux_layer_ids)

    def remembered_schedule() -> SchedulerOutput:
        decided.append(schedule())
        return decided[-1]

    core.runner.execute = checked_execute  # type: ignore[method-assign]
    core.scheduler.schedule = remembered_schedule  # type: ignore[method-assign]
    cycle = list(range(FIRST_CYCLE_TOKEN, FIRST_CYCLE_TOKEN + 9))
    for i in range(14):
        # Prompts that repeat the fake model's cycle, so n-gram drafts are often accepted, sometimes not.
        prompt = [rng.randrange(3, 60) for _ in range(rng.randrange(1, 30))] + cycle[: rng.randrange(0, 9)]
        temperature = rng.choice([0.0, 0.0, 1.0])
        params = SamplingParams(max_tokens=rng.randrange(1, 40), temperature=temperature, seed=i)
        core.add_request(EngineCoreRequest(f"r{i}", prompt, params))
    for step in range(400):
        if not core.has_work:
            break
        core.step()
        if step % 7 == 3 and core.requests:
            core.abort([rng.choice(sorted(core.requests))])
    assert not core.has_work and len(steps) > 30
    assert any(out.preempted for out in decided)
    for got, want in steps:
        assert_same_step(got, want)
    assert any(len(s.num_logits) and (s.num_logits > 1).any() for s, _ in steps)  # drafts were verified
