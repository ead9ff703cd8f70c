"""The frontend's flags about how it serves (:func:`add_frontend_args`), shared by ``openinfer-frontend`` and
``openinfer-serve``.

This module imports neither aiohttp nor prometheus_client (nor zmq): the launcher reads these flags without
loading the HTTP server (docs/design.md's layout table; ``tests/test_layout.py`` checks it).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from openinfer.frontend.metrics.spec_decode.per_request import PerRequestSpecMetrics
from openinfer.frontend.openai.parsers.chat_parsers import add_chat_parser_args
from openinfer.frontend.openai.structured_outputs_config import add_structured_outputs_arg

# vLLM's variable for its keep-alive timeout (uvicorn's timeout_keep_alive), and uvicorn's default
_KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
_KEEP_ALIVE_DEFAULT_S = 5.0


def add_frontend_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Every flag about how the frontend serves, not where it listens or with which keys (those are
    :func:`openinfer.frontend.process.main.parse_args`' own): ``openinfer-serve`` takes these and passes them on to
    its frontend as given."""
    parser.add_argument(
        "--engine-timeout",
        type=positive_seconds,
        default=5.0,
        help="seconds of silence after which an engine is dead and its requests fail",
    )
    parser.add_argument(
        "--per-request-spec-decode-metrics",
        type=_per_request_spec_metrics,
        default=PerRequestSpecMetrics.SUMMARY,
        metavar="{" + ",".join(mode.value for mode in PerRequestSpecMetrics) + "}",
        help='what a final response tells of its speculative decoding, under "metrics" (default: summary)',
    )
    parser.add_argument(
        "--spec-log-interval",
        type=positive_seconds,
        default=10.0,
        help='seconds between "SpecDecoding metrics" log lines (summed over engines; none without drafts)',
    )
    parser.add_argument(
        "--drafter-timeout",
        type=positive_seconds,
        default=120.0,
        help="seconds the admin drafter routes wait for an engine to load or unload its drafter",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="keep the exported counter totals and per-engine baselines here (saved before every scrape "
        "and every --state-interval), so a restarted frontend continues every series exactly",
    )
    parser.add_argument(
        "--state-interval",
        type=positive_seconds,
        default=1.0,
        help="seconds between saves of --state-dir besides those before each scrape",
    )
    parser.add_argument(
        "--max-queued-per-engine",
        type=_positive_int,
        default=256,
        help="unfinished requests one engine may hold; past it (on every engine of the model) new "
        "requests get 503 with Retry-After",
    )
    parser.add_argument(
        "--max-queued-total",
        type=_positive_int,
        default=1024,
        help="unfinished requests the frontend holds in all; past it new requests get 503 with Retry-After",
    )
    parser.add_argument(
        "--allowed-origins",
        type=_json_strings,
        default=[],
        metavar="JSON",
        help="origins whose web pages may call the API from a browser (CORS), a JSON list: '[\"http://"
        "localhost:3000\"]', or '[\"*\"]' for any. Default: none, and no CORS header at all (vLLM's "
        'default is ["*"])',
    )
    for flag, what in (
        ("--allowed-methods", "methods they may use"),
        ("--allowed-headers", "request headers they may send"),
    ):
        parser.add_argument(
            flag,
            type=_json_strings,
            default=["*"],
            metavar="JSON",
            help=f'with --allowed-origins: the {what}, a JSON list (default: ["*"], any)',
        )
    parser.add_argument(
        "--allow-credentials",
        action="store_true",
        help="with --allowed-origins: their pages may send cookies and Authorization along",
    )
    parser.add_argument(
        "--http-timeout-keep-alive",
        type=positive_seconds,
        default=None,  # from the environment, read after parsing so that a bad value is named as such
        metavar="SECONDS",
        help="close a connection whose next request's headers are not in within this many seconds of its "
        f"start or its last response, idle or half-sent (default: ${_KEEP_ALIVE_ENV}, else "
        f"{_KEEP_ALIVE_DEFAULT_S:g}, vLLM's); a response in progress is never cut",
    )
    parser.add_argument(
        "--http-timeout-body",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="answer 408 to a request whose body is not all in within this many seconds of its headers "
        "(default: 60; uvicorn, so vLLM, has no such bound)",
    )
    add_chat_parser_args(parser)
    add_structured_outputs_arg(parser)
    parser.add_argument(
        "--grammar-check-timeout",
        type=positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="a structured-outputs constraint (JSON schema, regex, grammar) that xgrammar takes longer than "
        "this to compile is a 400, before it reaches an engine",
    )
    parser.add_argument(
        "--chat-template-timeout",
        type=positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="a model's chat template that takes longer than this to render a request's messages is a 500 "
        "(its worker process is killed); a normal render takes about a millisecond",
    )


def add_api_key_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup, passed_on: str = "") -> None:
    """``--api-key`` and ``--admin-api-key``, by default from the environment (which keeps them out of `ps`);
    ``passed_on`` ends each help text with how the keys reach the frontend (openinfer-serve's)."""
    parser.add_argument(
        "--api-key",
        default=env_key("OPENINFER_API_KEY", "VLLM_API_KEY"),
        help="require `Authorization: Bearer KEY` on every route but /health and /metrics (default: "
        f"$OPENINFER_API_KEY, else $VLLM_API_KEY, which keep it out of `ps`; none when unset){passed_on}",
    )
    parser.add_argument(
        "--admin-api-key",
        default=env_key("OPENINFER_ADMIN_API_KEY"),
        help="the key of the /admin routes, instead of --api-key (default: $OPENINFER_ADMIN_API_KEY); "
        f"without either they are off{passed_on}",
    )


def env_key(*names: str) -> str | None:
    """The first of these environment variables that is set and not empty (empty means no key)."""
    return next((os.environ[name] for name in names if os.environ.get(name)), None)


def _json_strings(value: str) -> list[str]:
    """A JSON list of strings, as vLLM's --allowed-origins & co. take them."""
    try:
        items = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings such as '[\"*\"]': {e}") from None
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings such as '[\"*\"]', got {value}")
    return items


def _per_request_spec_metrics(value: str) -> PerRequestSpecMetrics:
    try:
        return PerRequestSpecMetrics(value)
    except ValueError:
        modes = ", ".join(mode.value for mode in PerRequestSpecMetrics)
        raise argparse.ArgumentTypeError(f"choose one of {modes}; got {value!r}") from None


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return number


def keep_alive_from_env(parser: argparse.ArgumentParser) -> float:
    """--http-timeout-keep-alive's default: ``$VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, else 5; a usage error naming
    the variable when it holds something else than a positive number."""
    value = os.environ.get(_KEEP_ALIVE_ENV)
    if not value:
        return _KEEP_ALIVE_DEFAULT_S
    try:
        return positive_seconds(value)
    except (ValueError, argparse.ArgumentTypeError):
        parser.error(
            f"${_KEEP_ALIVE_ENV} (the default of --http-timeout-keep-alive) must be a positive number of "
            f"seconds, got {value!r}: fix or unset it, or pass --http-timeout-keep-alive"
        )


def positive_seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {value}")
    return seconds
