"""``openinfer-serve``'s command line: its own flags, every ``openinfer-engine`` and ``openinfer-frontend``
flag (added from their own definitions, so nothing is copied), a positional model as in ``vllm serve MODEL``,
and vLLM's flags that openinfer lacks, refused with what to use instead.

Each engine and frontend flag reaches its process as it was typed: :func:`routed_flags` re-reads the command
line with every flag's owner and hands each child its own tokens. The few flags the launcher decides itself
(the model and its drafter with the built-in defaults, each engine's placement and spec log, the frontend's
address, keys and API key) are not passed on as given but set per child by ``serve.py``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openinfer.engine_core.config import DeviceKind
from openinfer.engine_core.launch.supervisor import RestartPolicy
from openinfer.engine_core.launch.vllm_flags import (
    SPECULATIVE_CONFIG_HELP,
    add_unsupported_vllm_args,
    read_speculative_config,
    unsupported_flags_epilog,
    unsupported_vllm_flag,
)
from openinfer.engine_core.process.engine_args import add_engine_args, num_spec_tokens_without_drafter
from openinfer.frontend.openai.parsers.chat_parsers import chat_parsers
from openinfer.frontend.process.flags import add_api_key_args, add_frontend_args

ENGINE, FRONTEND = "engine", "frontend"
# Engine flags serve.py sets per engine from what it resolved (the built-in pair, K's default, spec logs).
LAUNCHER_SETS = frozenset({"model", "served_model_name", "spec_method", "num_spec_tokens", "draft_model"})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The launcher's flags; ``engine_argv`` and ``frontend_argv`` hold the flags passed on as typed."""
    parser, owners = build_parser()
    args = parser.parse_args(argv)
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            parser.error(f"the model is given twice ({args.model_tag} and --model {args.model}): give one")
        args.model = args.model_tag
    refusal = unsupported_vllm_flag(args)
    if refusal is not None:
        parser.error(refusal)
    speculative = None
    if args.speculative_config is not None:
        if args.spec_method or args.num_spec_tokens is not None or args.draft_model or args.no_spec:
            parser.error(
                "--speculative-config says what --spec-method, --num-spec-tokens, --draft-model and --no-spec "
                "say: give one or the other"
            )
        try:
            speculative = read_speculative_config(args.speculative_config)
        except ValueError as e:
            parser.error(str(e))
        args.spec_method, args.num_spec_tokens = speculative.method, speculative.num_spec_tokens
        args.draft_model = speculative.draft_model
    check_args(parser, args)
    tokens = routed_flags(parser, owners, argv)
    args.engine_argv, args.frontend_argv = tokens[ENGINE], tokens[FRONTEND]
    if speculative is not None:
        args.engine_argv = [*args.engine_argv, *speculative.engine_flags]
    return args


def build_parser() -> tuple[argparse.ArgumentParser, dict[argparse.Action, str]]:
    """The parser, and which child each passed-on flag belongs to."""
    parser = argparse.ArgumentParser(
        prog="openinfer-serve",
        description="A frontend and N local engines in one command; an engine or the frontend that dies is "
        "restarted. Runs until Ctrl-C, SIGTERM or SIGHUP.",
        epilog=unsupported_flags_epilog(),
        allow_abbrev=False,  # so that every flag reaches its child exactly as typed
    )
    parser.add_argument(
        "model_tag", nargs="?", metavar="MODEL", help="the model folder, as `vllm serve MODEL` (or --model)"
    )
    add_launcher_args(parser.add_argument_group("the launcher"))
    owners: dict[argparse.Action, str] = {}
    for owner, title, add in (
        (ENGINE, "every engine (openinfer-engine's flags)", add_engine_args),
        (FRONTEND, "the frontend (openinfer-frontend's flags)", add_frontend_args),
    ):
        first = len(parser._actions)
        add(parser.add_argument_group(title))
        owners.update(
            (action, owner) for action in parser._actions[first:] if action.dest not in LAUNCHER_SETS
        )
    vllm = parser.add_argument_group("vLLM's flags")
    vllm.add_argument("--speculative-config", metavar="JSON", help=SPECULATIVE_CONFIG_HELP)
    add_unsupported_vllm_args(vllm)
    return parser, owners


def add_launcher_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--engines", type=int, default=1, help="number of local engine processes")
    group.add_argument(
        "--api-server-count",
        type=int,
        default=1,
        help="frontend processes sharing --port over the same engines, each relaying its own requests; a "
        "scrape of /metrics on the port shows the whole server (vLLM's flag)",
    )
    group.add_argument(
        "--device",
        choices=list(DeviceKind),
        default="cpu",
        help="cpu, or cuda: engine i runs on GPU i (with --tensor-parallel-size N, on GPUs i*N ... i*N + N - 1)",
    )
    group.add_argument("--host", default="127.0.0.1", help="the frontend's HTTP address")
    group.add_argument("--port", type=int, default=8000, help="the frontend's HTTP port")
    group.add_argument(
        "--engine-port",
        type=int,
        default=5555,
        help="the frontend's engine ports (on 127.0.0.1): requests on this one, outputs on the next",
    )
    add_api_key_args(group, "; the frontends get it in their environment, never on their command line")
    group.add_argument(
        "--zmq-curve-keys",
        type=Path,
        metavar="DIR",
        help="CurveZMQ between the frontend and the engines with the keys in DIR (made there, as "
        "openinfer-keys DIR --engines N does, when DIR has none); default: keys made for this run in a "
        "private folder, removed when serve exits",
    )
    group.add_argument("--no-spec", action="store_true", help="no speculative decoding")
    group.add_argument("--spec-log-dir", help="each engine appends its spec log to DIR/spec-engine<i>.jsonl")
    group.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for /health")
    defaults = RestartPolicy()
    group.add_argument(
        "--engine-restart-limit",
        type=int,
        default=defaults.max_restarts,
        help="restarts of one engine, or of the frontend, allowed within a minute; when it dies once more, "
        "stop everything",
    )
    group.add_argument(
        "--engine-restart-backoff",
        type=float,
        default=defaults.backoff,
        help="seconds before an engine, or the frontend, is restarted, doubled for each restart of it in "
        "the last minute",
    )
    group.add_argument(
        "--engine-restart-backoff-max",
        type=float,
        default=defaults.max_backoff,
        help="the longest wait before a restart of an engine, or of the frontend",
    )
    group.add_argument(
        "--log-level", default="info", type=str.lower, choices=["debug", "info", "warning", "error"]
    )


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors across flags, before anything starts. The rules between engine flags are the engines' own
    (``engine_args.config_from_args``): ``serve.prepare`` runs them before any child starts."""
    if args.engines < 1:
        parser.error("--engines must be >= 1")
    if args.api_server_count < 1:
        parser.error("--api-server-count must be >= 1")
    if args.no_spec and (args.spec_method or args.num_spec_tokens is not None or args.draft_model):
        parser.error(
            "--no-spec turns speculation off: drop --spec-method, --num-spec-tokens and --draft-model"
        )
    refusal = num_spec_tokens_without_drafter(args)  # the engines' rule; without --model, the built-in drafts
    if args.model is not None and refusal is not None:
        parser.error(refusal)
    if args.spec_log is not None and (args.engines > 1 or args.spec_log_dir):
        parser.error("--spec-log is one engine's file: give it with one engine, or --spec-log-dir DIR")
    try:
        args.restart_policy = RestartPolicy(
            args.engine_restart_limit, 60.0, args.engine_restart_backoff, args.engine_restart_backoff_max
        )
        chat_parsers(args)
    except ValueError as e:
        parser.error(str(e))


def routed_flags(
    parser: argparse.ArgumentParser, owners: dict[argparse.Action, str], argv: Sequence[str] | None
) -> dict[str, list[str]]:
    """Each owner's flags from ``argv``, as typed and in order (``--flag=value``, so that no value can be
    read as a flag). ``argv`` must already have parsed with ``parser``."""
    tokens: dict[str, list[str]] = {ENGINE: [], FRONTEND: []}
    reader = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        sink = tokens[owners[action]] if action in owners else None
        if action.option_strings:
            reader.add_argument(
                *action.option_strings, dest=action.dest, nargs=action.nargs, action=_Record, sink=sink
            )
        else:  # the positional model
            reader.add_argument(action.dest, nargs=action.nargs, action=_Record, sink=sink)
    reader.parse_args(argv)
    return tokens


class _Record(argparse.Action):
    """Appends the flag as it was given to its owner's tokens (``sink``; None: the launcher's own)."""

    def __init__(self, option_strings: list[str], dest: str, sink: list[str] | None, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.sink = sink

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if self.sink is None or option_string is None:
            return
        if isinstance(values, str):
            self.sink.append(f"{option_string}={values}")
        else:  # a switch (no values), or a flag taking several
            self.sink += [option_string, *(values or [])]
