"""openinfer-serve's choices: the built-in model drafts with its DFlash drafter unless told otherwise."""

from __future__ import annotations

import pytest

from openinfer.engine_core.builtin_model import builtin_drafter_folder, builtin_target_folder
from openinfer.engine_core.serve import engine_command, frontend_command, parse_args, resolve_builtin


def engine_flags(*argv: str) -> list[str]:
    args = parse_args(list(argv))
    resolve_builtin(args)
    return engine_command(args, 0)


def flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_no_arguments_serve_the_builtin_pair() -> None:
    """No arguments: the built-in target as openinfer-tiny-qwen3 with the built-in DFlash drafter, K=7."""
    command = engine_flags()
    assert flag(command, "--model") == str(builtin_target_folder())
    assert flag(command, "--served-model-name") == "openinfer-tiny-qwen3"
    assert flag(command, "--spec-method") == "dflash"
    assert flag(command, "--num-spec-tokens") == "7"
    assert flag(command, "--draft-model") == str(builtin_drafter_folder())


@pytest.mark.parametrize(
    ("argv", "method", "k", "draft"),
    [
        (["--spec-method", "ngram"], "ngram", "7", None),  # K defaults to 7 for any drafter
        (["--no-spec"], None, None, None),
        (["--num-spec-tokens", "3"], "dflash", "3", str(builtin_drafter_folder())),
        (["--spec-method", "dflash", "--draft-model", "/d"], "dflash", "7", "/d"),
        (["--model", "/m"], None, None, None),  # a model of one's own drafts only when asked
        (["--model", "/m", "--spec-method", "ngram"], "ngram", "7", None),
    ],
)
def test_switches(argv: list[str], method: str | None, k: str | None, draft: str | None) -> None:
    """--spec-method ngram and --no-spec switch the built-in drafter; --model assumes nothing."""
    command = engine_flags(*argv)
    assert (flag(command, "--spec-method"), flag(command, "--num-spec-tokens")) == (method, k)
    assert flag(command, "--draft-model") == draft


@pytest.mark.parametrize(
    "argv",
    [
        ["--no-spec", "--spec-method", "ngram"],
        ["--no-spec", "--num-spec-tokens", "3"],
        ["--model", "/m", "--draft-model", "/d"],
    ],
)
def test_contradictions_are_refused(argv: list[str]) -> None:
    """--no-spec with drafter flags, or drafter options with --model but no method, is a usage error."""
    with pytest.raises(SystemExit):
        parse_args(argv)


@pytest.mark.parametrize(("argv", "dtype"), [([], "auto"), (["--dtype", "bfloat16"], "bfloat16")])
def test_dtype_reaches_every_engine(argv: list[str], dtype: str) -> None:
    """--dtype (vLLM's flag and openinfer-engine's choices) is passed to each engine; auto by default."""
    args = parse_args(["--model", "/m", "--engines", "2", *argv])
    resolve_builtin(args)
    assert [flag(engine_command(args, i), "--dtype") for i in range(2)] == [dtype, dtype]


def test_unknown_dtype_is_refused() -> None:
    """Only auto, float32, bfloat16 and float16 are dtypes."""
    with pytest.raises(SystemExit):
        parse_args(["--dtype", "int8"])


def test_enforce_eager_reaches_every_engine_and_its_config() -> None:
    """--enforce-eager (vLLM's flag) goes to each engine, whose config then turns CUDA graphs off."""
    from openinfer.engine_core.engine_cli import config_from_args
    from openinfer.engine_core.engine_cli import parse_args as engine_args

    command = engine_flags("--enforce-eager")
    assert "--enforce-eager" in command and "--enforce-eager" not in engine_flags()
    assert config_from_args(engine_args(command[command.index("--model") :])).enforce_eager
    assert not config_from_args(engine_args([])).enforce_eager


@pytest.mark.parametrize(("argv", "caching"), [([], True), (["--no-enable-prefix-caching"], False)])
def test_prefix_caching_is_on_unless_turned_off(argv: list[str], caching: bool) -> None:
    """--no-enable-prefix-caching (vLLM's flag) reaches each engine's config; caching is on by default."""
    from openinfer.engine_core.engine_cli import config_from_args
    from openinfer.engine_core.engine_cli import parse_args as engine_args

    command = engine_flags(*argv)
    assert config_from_args(engine_args(command[command.index("--model") :])).enable_prefix_caching is caching
    assert config_from_args(engine_args(argv)).enable_prefix_caching is caching


@pytest.mark.parametrize(("argv", "backend"), [([], "auto"), (["--attention-backend", "triton"], "triton")])
def test_attention_backend_reaches_every_engine(argv: list[str], backend: str) -> None:
    """--attention-backend (openinfer-engine's choices) is passed to each engine; auto by default."""
    args = parse_args(["--model", "/m", "--engines", "2", *argv])
    resolve_builtin(args)
    assert [flag(engine_command(args, i), "--attention-backend") for i in range(2)] == [backend, backend]


@pytest.mark.parametrize(
    "flags",
    [[], ["--reasoning-parser", "qwen3"], ["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
     "--enable-auto-tool-choice"], ["--tool-call-parser", "hermes"],
     ["--structured-outputs-config", '{"disable_any_whitespace": true}']],
)  # fmt: skip
def test_chat_parser_flags_reach_the_frontend(flags: list[str]) -> None:
    """vLLM's --reasoning-parser, --tool-call-parser, --enable-auto-tool-choice and
    --structured-outputs-config go to the frontend."""
    command = frontend_command(parse_args(flags))
    after_log_level = command[command.index("--log-level") + 2 :]  # the frontend's flags end with these
    assert after_log_level == flags


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--reasoning-parser", "deepseek_r1"],
            "unknown reasoning parser 'deepseek_r1'; openinfer has: qwen3",
        ),
        (["--tool-call-parser", "mistral"], "unknown tool call parser 'mistral'; openinfer has: hermes"),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
    ],
)
def test_parsers_that_cannot_work_are_refused_at_start(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown parser name, or auto tool choice without a tool parser: a usage error saying so, before
    anything starts (openinfer-frontend says the same, tests/frontend/test_main.py)."""
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert words in capsys.readouterr().err
