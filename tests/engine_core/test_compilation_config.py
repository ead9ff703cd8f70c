"""-O and --compilation-config, vLLM's flags, on openinfer-engine and openinfer-serve: the level and cache
folder reach the engine's config, -O wins over the JSON's level, a bare level is taken, the compile and CUDA
graph sizes and cudagraph_mode are read, vLLM's keys that openinfer has not are refused by name, and without
either flag the step runs eagerly (DEFAULT_LEVEL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.engine_core.compilation_config import DEFAULT_LEVEL, CompilationConfig, read_compilation_config
from openinfer.engine_core.launch.serve_args import parse_args as serve_args
from openinfer.engine_core.process.engine_args import config_from_args, parse_args


def compilation(*argv: str) -> CompilationConfig:
    return config_from_args(parse_args(list(argv))).compilation


def test_levels_and_cache_folder() -> None:
    assert compilation("-O3") == CompilationConfig(level=3)
    assert compilation("-O", "0").compiles is False and compilation("-O1").compiles
    assert compilation().compiles is (DEFAULT_LEVEL > 0)
    config = compilation("--compilation-config", '{"level": 2, "cache_dir": "/tmp/c"}', "-O0")
    assert config == CompilationConfig(level=0, cache_dir="/tmp/c")  # -O's level over the JSON's
    assert compilation("--compilation-config", '{"mode": 3}').compiles
    assert read_compilation_config("3") == CompilationConfig(level=3)  # vLLM's bare form
    assert CompilationConfig(cache_dir="~/x").artifact_dir() == Path.home() / "x"
    sized = compilation(
        "--compilation-config",
        '{"compile_sizes": [1, 8], "cudagraph_capture_sizes": [4, 1, 2], "cudagraph_mode": "FULL_DECODE_ONLY"}',
    )
    assert sized.compile_sizes == [1, 8] and sized.capture_sizes(256) == (1, 2, 4) and sized.cuda_graphs
    assert not compilation("--compilation-config", '{"cudagraph_mode": "NONE"}').cuda_graphs


def test_serve_passes_them_to_every_engine() -> None:
    """openinfer-serve's -O3 and JSON reach the engines' command lines as flags their parser reads back."""
    args = serve_args(["-O3", "--compilation-config", '{"cache_dir": "/tmp/c"}'])
    assert compilation(*args.engine_argv) == CompilationConfig(level=3, cache_dir="/tmp/c")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"backend": "eager"}', "unknown field `backend`"),
        ('{"level": 4}', r"level must be 0 \(eager\) to 3 \(compiled\), got 4"),
        ('{"level": 1, "mode": 3}', "level 1 and mode 3 disagree"),
        ("[3]", "Expected `object`"),
        ('{"compile_sizes": [0, 8]}', r"compile_sizes must be positive, got \[0, 8\]"),
        ('{"cudagraph_capture_sizes": ["a"]}', "Expected `int`"),
        ('{"cudagraph_mode": "full"}', "cudagraph_mode must be one of NONE, PIECEWISE, FULL"),
    ],
)
def test_refusals(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_compilation_config(text)
