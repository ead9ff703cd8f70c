"""Builders of in-process engine cores and their prompts, for tests that drive an engine without sockets."""

from __future__ import annotations

import random
from pathlib import Path

from openinfer.engine_core.config import Device, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.process.engine_cli import load_runner


def make_core(
    folder: Path, served_model_name: str = "t", device: str = "cpu", **overrides: object
) -> EngineCore:
    """An engine core over the checkpoint in ``folder`` (``fake_model=True``: the fake runner) on ``device``
    (torch's spelling), with the runner the engine process would load and ``overrides`` of
    ``EngineConfig``'s defaults."""
    config = EngineConfig(
        model_path=folder, served_model_name=served_model_name, device=Device.parse(device), **overrides
    )  # type: ignore[arg-type]
    return EngineCore(config, load_runner(config))


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
