"""openinfer-serve's choices: the built-in model drafts with its DFlash drafter unless told otherwise."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from openinfer.engine_core.builtin_model import builtin_drafter_folder, builtin_target_folder
from openinfer.engine_core.config import Device, DeviceKind
from openinfer.engine_core.launch.serve import engine_command, frontend_command, parse_args, resolve_builtin
from openinfer.engine_core.process.engine_args import config_from_args
from openinfer.engine_core.process.engine_args import parse_args as engine_args
from openinfer.frontend.process.main import parse_args as frontend_args


def engine_flags(*argv: str, index: int = 0) -> argparse.Namespace:
    """What engine ``index`` reads from the command line ``openinfer-serve argv`` gives it."""
    args = parse_args(list(argv))
    resolve_builtin(args)
    return engine_args(engine_command(args, index)[3:])  # after `python -m module`


def frontend_flags(*argv: str) -> argparse.Namespace:
    """What the frontend reads from the command line ``openinfer-serve argv`` gives it."""
    return frontend_args(frontend_command(parse_args(list(argv)))[3:])


def test_no_arguments_serve_the_builtin_pair() -> None:
    """No arguments: the built-in target as openinfer-tiny-qwen3 with the built-in DSpark drafter, K=7, under
    adaptive verification (DSpark's default; --no-enable-adaptive-verification turns it off)."""
    engine = engine_flags()
    assert engine.model == str(builtin_target_folder())
    assert engine.served_model_name == "openinfer-tiny-qwen3"
    assert (engine.spec_method, engine.num_spec_tokens) == ("dspark", 7)
    assert engine.draft_model == str(builtin_drafter_folder("dspark"))
    spec = config_from_args(engine).speculative
    assert spec is not None and spec.adaptive_verification
    off = config_from_args(engine_flags("--no-enable-adaptive-verification")).speculative
    assert off is not None and off.method == "dspark" and not off.adaptive_verification


@pytest.mark.parametrize(
    ("argv", "adaptive"),
    [
        (["--spec-method", "dflash"], False),  # on by default for dspark only
        (["--spec-method", "dflash", "--enable-adaptive-verification"], True),
        (["--spec-method", "ngram"], False),
        (["--spec-method", "dspark"], True),
        (["--speculative-config", '{"method": "dspark", "num_speculative_tokens": 7}'], True),
        (["--speculative-config", '{"method": "dspark", "enable_adaptive_verification": false}'], False),
    ],
)
def test_adaptive_verification_defaults(argv: list[str], adaptive: bool) -> None:
    """Adaptive verification is on where it is not given for DSpark, off for the other drafters; the flag and
    the speculative config's key say otherwise either way."""
    spec = config_from_args(engine_flags(*argv)).speculative
    assert spec is not None and spec.adaptive_verification is adaptive


@pytest.mark.parametrize(
    ("argv", "method", "k", "draft"),
    [
        (["--spec-method", "ngram"], "ngram", 7, None),  # K defaults to 7 for any drafter
        (["--no-spec"], None, None, None),
        (["--num-spec-tokens", "3"], "dspark", 3, str(builtin_drafter_folder("dspark"))),
        (["--spec-method", "dflash"], "dflash", 7, str(builtin_drafter_folder("dflash"))),
        (["--spec-method", "dspark"], "dspark", 7, str(builtin_drafter_folder("dspark"))),
        (["--spec-method", "dflash", "--draft-model", "/d"], "dflash", 7, "/d"),
        (["--model", "/m"], None, None, None),  # a model of one's own drafts only when asked
        (["--model", "/m", "--spec-method", "ngram"], "ngram", 7, None),
        (["/m", "--spec-method", "ngram"], "ngram", 7, None),  # the model as `vllm serve MODEL`
        (["--fake-model", "--spec-method", "ngram"], "ngram", 7, None),  # no model: nothing built in
    ],
)
def test_switches(argv: list[str], method: str | None, k: int | None, draft: str | None) -> None:
    """--spec-method ngram and --no-spec switch the built-in drafter; a model of one's own assumes nothing."""
    engine = engine_flags(*argv)
    assert (engine.spec_method, engine.num_spec_tokens, engine.draft_model) == (method, k, draft)


@pytest.mark.parametrize(
    "argv",
    [
        ["--no-spec", "--spec-method", "ngram"],
        ["--no-spec", "--num-spec-tokens", "3"],
        ["--model", "/m", "--num-spec-tokens", "3"],
    ],
)
def test_contradictions_are_refused(argv: list[str]) -> None:
    """--no-spec with drafter flags, or K with --model but no method nor drafter, is a usage error."""
    with pytest.raises(SystemExit):
        parse_args(argv)


@pytest.mark.parametrize(
    "flags",
    [[], ["--reasoning-parser", "qwen3"], ["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
     "--enable-auto-tool-choice"], ["--tool-call-parser", "hermes"],
     ["--structured-outputs-config", '{"disable_any_whitespace": true}']],
)  # fmt: skip
def test_chat_parser_flags_reach_the_frontend(flags: list[str]) -> None:
    """vLLM's --reasoning-parser, --tool-call-parser, --enable-auto-tool-choice and
    --structured-outputs-config go to the frontend, which reads them as given."""
    assert frontend_flags(*flags).chat_parsers == frontend_args(flags).chat_parsers
    assert frontend_flags(*flags).structured_outputs_config == frontend_args(flags).structured_outputs_config
    assert not set(flags) & set(engine_command(parse_args(["/m", *flags]), 0))  # none reaches an engine


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


@pytest.mark.parametrize(
    ("argv", "model"),
    [
        (["/m"], "/m"),
        (["/m", "--model", "/m"], "/m"),
        (["--model", "/m"], "/m"),
        ([], str(builtin_target_folder())),
    ],
)
def test_the_model_is_positional_or_a_flag(argv: list[str], model: str) -> None:
    """`openinfer-serve MODEL` is `--model MODEL` (as `vllm serve MODEL`); no model: the built-in target."""
    assert engine_flags(*argv).model == model


def test_two_different_models_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A positional model and a different --model: a usage error naming both."""
    with pytest.raises(SystemExit):
        parse_args(["/m", "--model", "/n"])
    assert "the model is given twice (/m and --model /n)" in capsys.readouterr().err


def test_every_engine_gets_its_own_index_device_and_spec_log() -> None:
    """Engine i: --engine-index i, GPU i under --device cuda, DIR/spec-engine<i>.jsonl; the rest alike."""
    argv = ["/m", "--engines", "2", "--device", "cuda", "--spec-log-dir", "/logs", "--max-num-seqs", "8"]
    engines = [engine_flags(*argv, index=i) for i in range(2)]
    assert [(e.engine_index, e.gpu, str(e.spec_log)) for e in engines] == [
        (0, (0,), "/logs/spec-engine0.jsonl"),
        (1, (1,), "/logs/spec-engine1.jsonl"),
    ]
    assert [e.max_num_seqs for e in engines] == [8, 8]
    assert config_from_args(engines[1]).device == Device(DeviceKind.CUDA, 1)


@pytest.mark.parametrize(
    "argv",
    [["--spec-log", "/s.jsonl", "--engines", "2"], ["--spec-log", "/s.jsonl", "--spec-log-dir", "/logs"]],
)
def test_one_spec_log_for_many_engines_is_refused(argv: list[str]) -> None:
    """--spec-log names one file: with several engines (or --spec-log-dir too) it is a usage error."""
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert str(engine_flags("--spec-log", "/s.jsonl").spec_log) == "/s.jsonl"  # with one engine it is passed


@pytest.mark.parametrize(
    ("config", "method", "k"),
    [
        ({"architectures": ["Qwen3DSparkModel"], "block_size": 7, "markov_rank": 256}, "dspark", 7),
        (
            {"architectures": ["Qwen3DSparkModel"], "block_size": 7, "enable_confidence_head": True},
            "dspark",
            7,
        ),
        ({"architectures": ["Qwen3DSparkModel"], "block_size": 7, "markov_rank": 0}, "dflash", 7),
        ({"architectures": ["DFlashDraftModel"], "block_size": 16}, "dflash", 15),
        ({"architectures": ["DFlashDraftModel"], "dflash_config": {"block_size": 8}}, "dflash", 7),
    ],
    ids=["dspark", "dspark-confidence-only", "deepspec-dflash", "zlab", "zlab-nested"],
)
def test_a_drafter_folder_names_its_method(
    tmp_path: Path, config: dict[str, object], method: str, k: int
) -> None:
    """--draft-model without --spec-method: the folder's config says the method (dspark for DeepSpec's
    Qwen3DSparkModel with a head) and K (DeepSpec's block_size drafts, z-lab's block_size - 1); a K given
    wins. The launcher and a bare engine read it alike."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    for argv in (["--model", "/m", "--draft-model", str(tmp_path)], ["--draft-model", str(tmp_path)]):
        engine = engine_flags(*argv)
        assert (engine.spec_method, engine.num_spec_tokens) == (method, k)
        assert engine_flags(*argv, "--num-spec-tokens", "3").num_spec_tokens == 3
    spec = config_from_args(engine_args(["--model", "/m", "--draft-model", str(tmp_path)])).speculative
    assert spec is not None and (spec.method, spec.num_spec_tokens) == (method, k)


def test_a_drafter_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read its config.json"):
        engine_flags("--model", "/m", "--draft-model", str(tmp_path))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--spec-method", "ngram", "--num-spec-tokens", "3", "--confidence-threshold", "0.5"],
         "needs --spec-method dspark"),
        (["--confidence-threshold", "0.5"], "needs a DSpark drafter"),
        (["--enable-adaptive-verification"], "needs a drafter"),
        (["--spec-method", "dspark", "--num-spec-tokens", "3", "--draft-model", "/d",
          "--confidence-threshold", "1.5"], r"in \[0, 1\]"),
    ],
)  # fmt: skip
def test_verification_options_need_their_drafter(argv: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        config_from_args(engine_args(["--model", "/m", *argv]))


def test_api_servers_share_the_port_and_every_engine_connects_to_all() -> None:
    """--api-server-count 3: api server i accepts on serve's listening socket (its inherited fd), binds the
    engine ports 5555 + 2i and gets its index, the count, the peers folder and a state folder there; engine
    e connects to all three, api server e mod 3 first (its metrics frontend)."""
    args = parse_args(["/m", "--engines", "4", "--api-server-count", "3"])
    resolve_builtin(args)
    args.peers_dir = Path("/run/peers")  # prepare() makes it
    frontends = [frontend_args(frontend_command(args, i, listen_fd=7)[3:]) for i in range(3)]
    assert [f.listen_fd for f in frontends] == [7, 7, 7]
    assert [f.engine_bind for f in frontends] == [f"tcp://127.0.0.1:{p}" for p in (5555, 5557, 5559)]
    assert [(f.api_server_index, f.api_server_count, str(f.peers_dir)) for f in frontends] == [
        (i, 3, "/run/peers") for i in range(3)
    ]
    assert [str(f.state_dir) for f in frontends] == [f"/run/peers/state/api-server-{i}" for i in range(3)]
    assert {f.port for f in frontends} == {8000}
    engines = [engine_args(engine_command(args, e)[3:]) for e in range(4)]
    ports = [[int(a.rsplit(":", 1)[1]) for a in e.frontend_addresses] for e in engines]
    assert ports == [[5555, 5557, 5559], [5557, 5559, 5555], [5559, 5555, 5557], [5555, 5557, 5559]]


def test_a_given_state_dir_holds_each_api_servers_folder() -> None:
    """With --state-dir DIR each api server keeps its state in DIR/api-server-i; one frontend keeps DIR."""
    args = parse_args(["--api-server-count", "2", "--state-dir", "/state"])
    args.peers_dir = Path("/run/peers")
    assert [str(frontend_args(frontend_command(args, i, 7)[3:]).state_dir) for i in range(2)] == [
        "/state/api-server-0",
        "/state/api-server-1",
    ]
    assert str(frontend_flags("--state-dir", "/state").state_dir) == "/state"


def test_no_api_servers_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--api-server-count 0 is a usage error."""
    with pytest.raises(SystemExit):
        parse_args(["--api-server-count", "0"])
    assert "--api-server-count must be >= 1" in capsys.readouterr().err
