"""openinfer-engine refuses bad speculative settings and a context past the model's at start, with a clear
message and no silent clamp."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--spec-method", "ngram", "--num-spec-tokens", "33"], "MAX_SPEC_TOKENS=32"),
        (["--spec-method", "ngram"], "--num-spec-tokens"),
        (["--num-spec-tokens", "4"], "--spec-method"),
        (["--spec-method", "dflash", "--num-spec-tokens", "4"], "--draft-model"),
        (
            ["--max-model-len", "1000000"],
            "is greater than the model's max_position_embeddings",
        ),  # vLLM's rule
    ],
)
def test_engine_refuses_bad_spec_settings(tiny_model: Path, args: list[str], message: str) -> None:
    """The engine exits with status 2 at load and says what is wrong (K=33 names the limit of 32)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "openinfer.engine_core.process.engine_cli",
            "--device",
            "cpu",
            "--model",
            str(tiny_model),
            "--frontend",
            "tcp://127.0.0.1:1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr
