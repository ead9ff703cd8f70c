"""openinfer-engine's flags that reach the model runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.process.engine_cli import config_from_args, parse_args


@pytest.mark.parametrize("backend", ["auto", "torch", "triton", "flash_attn"])
def test_attention_backend_flag(backend: str) -> None:
    """--attention-backend lands in EngineConfig as given; auto when absent."""
    assert config_from_args(parse_args([])).attention_backend == "auto"
    assert config_from_args(parse_args(["--attention-backend", backend])).attention_backend == backend


def test_unknown_attention_backend_is_refused() -> None:
    """The CLI and the config both refuse a backend that does not exist, naming the flag."""
    with pytest.raises(SystemExit):
        parse_args(["--attention-backend", "xformers"])
    with pytest.raises(ValueError, match="--attention-backend must be one of"):
        EngineConfig(model_path=Path("/m"), served_model_name="m", attention_backend="xformers")
