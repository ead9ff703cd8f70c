"""Builders of in-process engine cores and their prompts, for tests that drive an engine without sockets."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from openinfer.engine_core.config import Device, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.process.engine_cli import load_runner
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, SamplingParams, SpecDecodeCounters


def make_core(
    folder: Path, served_model_name: str = "t", device: str = "cpu", **overrides: Any
) -> EngineCore:
    """An engine core over the checkpoint in ``folder`` (``fake_model=True``: the fake runner) on ``device``
    (torch's spelling), with the runner the engine process would load and ``overrides`` of
    ``EngineConfig``'s defaults."""
    config = EngineConfig(
        model_path=folder, served_model_name=served_model_name, device=Device.parse(device), **overrides
    )
    return EngineCore(config, load_runner(config))


class CheckedSteps:
    """Steps an engine core and checks its spec-decode counters on every snapshot it would publish: each
    holds docs/design.md's invariants (`violation`) and none is below the one before (cumulative counters)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.snapshots = 0  # snapshots with spec-decode counters checked
        self._previous: SpecDecodeCounters | None = None

    def step(self) -> list[EngineCoreOutput]:
        outputs = self.core.step()
        counters = self.core.load_snapshot().spec_decode
        if counters is not None:
            problem = counters.violation()
            assert problem is None, f"snapshot {self.snapshots}: {problem}"
            if self._previous is not None:
                assert counters.minus(self._previous).is_nonnegative(), f"snapshot {self.snapshots} decreased"
            self._previous = counters.copy()
            self.snapshots += 1
        return outputs


def generate_greedy(core: EngineCore, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Run all prompts as one concurrent batch at temperature 0, EOS ignored; return each request's output
    tokens. Raises AssertionError if a request ends other than by max_tokens or the batch never drains."""
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    finished = set()
    for _ in range(10_000):  # bounds the loop: every request ends within max_tokens steps past its prompt
        for out in core.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finish is not None:
                assert out.finish.kind == "length", out.finish
                finished.add(out.request_id)
        if not core.has_work:
            break
    assert finished == set(outputs)
    return [outputs[str(i)] for i in range(len(prompts))]


def generate_with(
    core: EngineCore, prompts: list[list[int]], each: list[dict[str, Any]] | None = None, **options: Any
) -> tuple[list[list[int]], list[str]]:
    """All prompts as one batch with these ``SamplingParams`` options (by default 30 tokens at temperature 0,
    EOS ignored), and each[i]'s for request i, seeded i when sampling; each request's tokens and finish kind."""
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    finishes: dict[str, str] = {}
    options = {"max_tokens": 30, "temperature": 0.0, "ignore_eos": True, **options}
    for i, prompt in enumerate(prompts):
        own = {**options, **(each[i] if each else {})}
        seeded: dict[str, Any] = {"seed": i} if own["temperature"] else {}
        core.add_request(EngineCoreRequest(str(i), prompt, SamplingParams(**own, **seeded)))
    while core.has_work:
        for out in core.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finish is not None:
                finishes[out.request_id] = out.finish.kind
    return [outputs[str(i)] for i in range(len(prompts))], [finishes[str(i)] for i in range(len(prompts))]


def mixed_length_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Up to eight prompts over the built-in vocabulary (ids 3..511), of lengths 1, 3, 7, 16, 17, 33, 50 and 90:
    under, at and over 16-token block boundaries."""
    rng = random.Random(seed)
    lengths = [1, 3, 7, 16, 17, 33, 50, 90][:n]
    return [[rng.randrange(3, 512) for _ in range(length)] for length in lengths]


def spec_prompts(seed: int = 0) -> list[list[int]]:
    """Eight prompts of mixed lengths; half of them repeat a phrase, so that prompt lookup hits."""
    rng = random.Random(seed)
    prompts = []
    for i, length in enumerate([3, 9, 17, 30, 12, 45, 6, 60]):
        if i % 2:
            phrase = [rng.randrange(3, 512) for _ in range(5)]
            prompts.append((phrase * 20)[:length])
        else:
            prompts.append([rng.randrange(3, 512) for _ in range(length)])
    return prompts
