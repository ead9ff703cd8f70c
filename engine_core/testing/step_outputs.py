"""Builders of what a step's worker returns, for tests that drive the scheduler without a model."""

from __future__ import annotations

from openinfer.engine_core.worker.runner_output import ModelRunnerOutput


def sampled_output(*sampled: list[int]) -> ModelRunnerOutput:
    """A step's output in which sampling request i kept ``sampled[i]`` (accepted drafts, then the target's
    token), with no logprobs and no drafts."""
    return ModelRunnerOutput(list(sampled), [None] * len(sampled))
