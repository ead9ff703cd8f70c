"""openinfer-serve takes every openinfer-engine and openinfer-frontend flag and hands each to its child as
given; vLLM flags openinfer lacks are refused by name; the API key never reaches a command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from openinfer.engine_core.launch.serve import (
    curve_keys,
    engine_command,
    frontend_command,
    frontend_env,
    parse_args,
    prepare,
    resolve_builtin,
)
from openinfer.engine_core.launch.serve_args import LAUNCHER_SETS
from openinfer.engine_core.process.engine_args import add_engine_args, config_from_args
from openinfer.engine_core.process.engine_args import parse_args as engine_args
from openinfer.frontend.process.flags import add_frontend_args
from openinfer.frontend.process.main import parse_args as frontend_args

# Values for flags whose type takes only some strings; every other flag takes "3" (int, float, path, str).
SAMPLES = {
    "per_request_spec_decode_metrics": "detailed",
    "reasoning_parser": "qwen3",
    "tool_call_parser": "hermes",
    "structured_outputs_config": '{"disable_any_whitespace": true}',
    "allowed_origins": '["http://app.example"]',
    "allowed_methods": '["GET"]',
    "allowed_headers": '["Authorization"]',
    "kv_events_config": '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}',
    "compilation_config": '{"level": 3, "cache_dir": "/tmp/cache"}',
}
NEEDS = {"enable_auto_tool_choice": ["--tool-call-parser", "hermes"]}  # flags that work only with another


def flag_actions(add: Callable[[argparse.ArgumentParser], None]) -> list[argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False)
    add(parser)
    return [a for a in parser._actions if a.dest not in LAUNCHER_SETS]


def given(action: argparse.Action) -> list[str]:
    """The flag with a value other than its default, as a user would type it."""
    if action.nargs == 0:  # a switch; --no-... for one that is on by default
        return [action.option_strings[-1 if action.default else 0]]
    choices = [c for c in action.choices or [] if c != action.default]
    return [action.option_strings[0], str(choices[0]) if choices else SAMPLES.get(action.dest, "3")]


def child_reads(command: list[str], parse: Callable[[list[str]], argparse.Namespace]) -> argparse.Namespace:
    return parse(command[3:])  # after `python -m module`


@pytest.mark.parametrize("action", flag_actions(add_engine_args), ids=lambda a: a.option_strings[0])
def test_every_engine_flag_reaches_every_engine(action: argparse.Action) -> None:
    """Each openinfer-engine flag given to openinfer-serve is read by each engine as the engine itself
    would read it, and by the frontend not at all."""
    argv = ["/m", *given(action), *NEEDS.get(action.dest, [])]
    serve = parse_args(argv)
    expected = vars(engine_args(argv[1:]))[action.dest]
    assert expected != action.default
    for index in (0, 1):
        assert vars(child_reads(engine_command(serve, index), engine_args))[action.dest] == expected
    assert argv[1] not in " ".join(frontend_command(serve))


@pytest.mark.parametrize("action", flag_actions(add_frontend_args), ids=lambda a: a.option_strings[0])
def test_every_frontend_flag_reaches_the_frontend(action: argparse.Action) -> None:
    """Each openinfer-frontend flag given to openinfer-serve is read by its frontend as openinfer-frontend
    reads it, and by no engine."""
    argv = [*given(action), *NEEDS.get(action.dest, [])]
    serve = parse_args(argv)
    expected = vars(frontend_args(argv))[action.dest]
    assert expected != action.default
    assert vars(child_reads(frontend_command(serve), frontend_args))[action.dest] == expected
    assert argv[0] not in " ".join(engine_command(serve, 0))


def test_values_that_look_like_flags_stay_values() -> None:
    """A value beginning with '-' reaches the child as that value (flags are passed as --flag=value)."""
    serve = parse_args(["/m", "--served-model-name=-odd", "--seed=-1"])
    engine = child_reads(engine_command(serve, 0), engine_args)
    assert (engine.served_model_name, engine.seed) == ("-odd", -1)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-pp", "2"], "--pipeline-parallel-size 2 is vLLM's; openinfer has no pipeline parallelism"),
        (["-pp", "2"], "--tensor-parallel-size N"),
        (["--data-parallel-size", "2"], "data parallelism is --engines N"),
        (["-q", "awq"], "--quantization awq is vLLM's; openinfer serves unquantized weights only"),
        (["--kv-cache-dtype", "fp8"], "the weights' dtype (--dtype)"),
        (["--enable-lora"], "--enable-lora is vLLM's; openinfer serves no LoRA adapters"),
        (["--lora-modules", "a=/l"], "--lora-modules a=/l is vLLM's"),
        (
            ["--speculative-config", '{"method": "eagle3", "model": "/e"}'],
            "openinfer's are ngram, dflash, dspark",
        ),
        (["--speculative-config", '{"method": "ngram", "k": 3}'], "unknown field `k`"),
        (
            ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": "3"}'],
            "Expected `int | null`, got `str` - at `$.num_speculative_tokens`",
        ),
        (["--speculative-config", "[1]"], "Expected `object`, got `array`"),
        (["--speculative-config", '{"method": "ngram"}', "--spec-method", "ngram"], "give one or the other"),
        (["--cpu-offload-gb", "4"], "keeps every weight on the engine's device"),
        (["--tokenizer", "/t"], "reads the tokenizer from the model folder"),
    ],
)
def test_vllm_flags_openinfer_lacks_are_refused(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's parallelism, quantization, LoRA, ... flags: a usage error saying what openinfer does instead."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and words in capsys.readouterr().err


def test_neutral_vllm_values_are_accepted_and_passed_to_no_one() -> None:
    """-pp 1, -dp 1, --quantization none, --kv-cache-dtype auto, --cpu-offload-gb 0 and
    --trust-remote-code ask for nothing openinfer lacks: accepted, and no child sees them."""
    argv = ["-pp", "1", "-dp", "1", "-q", "none", "--kv-cache-dtype", "auto"]
    serve = parse_args([*argv, "--cpu-offload-gb", "0", "--trust-remote-code"])
    assert serve.engine_argv == [] and serve.frontend_argv == []


def test_the_api_key_goes_to_the_frontend_in_its_environment_only() -> None:
    """--api-key: in the frontend's environment as OPENINFER_API_KEY, on no command line."""
    serve = parse_args(["--api-key", "s3cret"])
    assert frontend_env(serve) == {"OPENINFER_API_KEY": "s3cret"}
    assert not any("s3cret" in arg for arg in frontend_command(serve) + engine_command(serve, 0))


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"OPENINFER_API_KEY": "a"}, "a"),
        ({"VLLM_API_KEY": "v"}, "v"),  # vLLM's variable
        ({"OPENINFER_API_KEY": "a", "VLLM_API_KEY": "v"}, "a"),
        ({"OPENINFER_API_KEY": ""}, None),  # an empty variable is no key
    ],
)
def test_the_api_key_can_come_from_the_environment(
    env: dict[str, str], key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --api-key, $OPENINFER_API_KEY, else $VLLM_API_KEY, is the key the frontend gets."""
    monkeypatch.delenv("OPENINFER_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert frontend_env(parse_args([])) == ({"OPENINFER_API_KEY": key} if key else None)


def test_curve_keys_are_made_when_missing(tmp_path: Path) -> None:
    """--zmq-curve-keys DIR: keys for the frontend and every engine made in an empty DIR, kept when there;
    a DIR without a key for some engine is refused; both children get DIR."""
    keys = tmp_path / "keys"
    curve_keys(keys, 2)
    made = sorted(p.relative_to(keys).as_posix() for p in keys.rglob("*.key*"))
    assert made == [
        "engines/engine-0.key", "engines/engine-0.key_secret", "engines/engine-1.key",
        "engines/engine-1.key_secret", "frontend.key", "frontend.key_secret",
    ]  # fmt: skip
    before = (keys / "frontend.key").read_bytes()
    curve_keys(keys, 2)
    assert (keys / "frontend.key").read_bytes() == before
    with pytest.raises(ValueError, match=r"no key for engine\(s\) 2"):
        curve_keys(keys, 3)
    serve = parse_args(["--zmq-curve-keys", str(keys)])
    assert child_reads(engine_command(serve, 1), engine_args).curve_keys == keys
    assert child_reads(frontend_command(serve), frontend_args).zmq_curve_keys == keys


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["/m", "--fake-model"], "--fake-model serves no model"),
        (["--no-spec", "--kv-cache-gb", "0"], "--kv-cache-gb must be positive"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1]"),
        (["--fake-model", "-tp", "2"], "--fake-model has no model to shard"),
    ],
)
def test_engine_flags_that_cannot_work_stop_serve_before_it_starts(argv: list[str], words: str) -> None:
    """An engine's own checks run in the launcher first: an error naming the flag, nothing started."""
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        prepare(parse_args(argv))


def test_the_builtin_drafter_runs_over_two_ranks() -> None:
    """openinfer-serve -tp 2 serves the built-in pair with its DSpark drafter under adaptive verification
    (every drafter runs at any N): the engine's flags as it will read them pass its checks."""
    serve = parse_args(["-tp", "2"])
    resolve_builtin(serve)
    config = config_from_args(engine_args(engine_command(serve, 0)[3:]))  # after `python -m module`
    assert config.tensor_parallel_size == 2
    spec = config.speculative
    assert spec is not None and (spec.method, spec.adaptive_verification) == ("dspark", True)


@pytest.mark.parametrize(
    ("given", "dtype"), [("half", "float16"), ("float", "float32"), ("bfloat16", "bfloat16")]
)
def test_vllm_dtype_names_are_accepted(given: str, dtype: str) -> None:
    """vLLM's --dtype half and float are float16 and float32."""
    assert engine_args(["--dtype", given]).dtype == dtype


def test_vllm_speculative_config_is_openinfers_drafter_flags() -> None:
    """vLLM's --speculative-config JSON: method, model and K become the launcher's drafter, the options the
    engine flags of those names; every engine reads them as if typed."""
    config = '{"method": "dspark", "model": "/d", "num_speculative_tokens": 7, "enable_adaptive_verification": true}'
    engine = child_reads(
        engine_command(parse_args(["--model", "/m", "--speculative-config", config]), 0), engine_args
    )
    assert (engine.spec_method, engine.num_spec_tokens, engine.draft_model) == ("dspark", 7, "/d")
    assert engine.enable_adaptive_verification
    ngram = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}'
    engine = child_reads(
        engine_command(parse_args(["--model", "/m", "--speculative-config", ngram]), 1), engine_args
    )
    assert (
        engine.spec_method,
        engine.num_spec_tokens,
        engine.prompt_lookup_min,
        engine.prompt_lookup_max,
    ) == ("ngram", 4, 2, 5)
    assert not engine.enable_adaptive_verification


def test_tensor_parallel_engines_get_their_ranks_gpus() -> None:
    """-tp 2 reaches every engine; under --device cuda engine i gets GPUs 2i and 2i + 1, one per rank."""
    serve = parse_args(["/m", "--engines", "2", "--device", "cuda", "-tp", "2", "--no-spec"])
    engines = [child_reads(engine_command(serve, index), engine_args) for index in (0, 1)]
    assert [(e.tensor_parallel_size, e.gpu) for e in engines] == [(2, (0, 1)), (2, (2, 3))]
    cpu = child_reads(engine_command(parse_args(["/m", "-tp", "2"]), 0), engine_args)
    assert (cpu.tensor_parallel_size, cpu.device, cpu.gpu) == (2, "cpu", None)
