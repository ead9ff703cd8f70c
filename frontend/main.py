"""``openinfer-frontend``: the OpenAI-compatible API process that engines connect to."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import zmq

from openinfer.frontend.addresses import engine_addresses, is_loopback_host, split_address
from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.server_keys import load_server_keys
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.request_spec_metrics import PerRequestSpecMetrics
from openinfer.frontend.metrics.state_dir import StateDir, StateError
from openinfer.frontend.openai.api_server import build_app, serve
from openinfer.frontend.openai.cors import CorsPolicy
from openinfer.frontend.openai.parsers.chat_parsers import add_chat_parser_args, chat_parsers
from openinfer.frontend.openai.structured_options import add_structured_outputs_arg
from openinfer.frontend.ready_pipe import say_ready

logger = logging.getLogger("openinfer.frontend")

# vLLM's variable for its keep-alive timeout (uvicorn's timeout_keep_alive), and uvicorn's default
_KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
_KEEP_ALIVE_DEFAULT_S = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="openinfer-frontend",
        description="Serve the OpenAI-compatible API and /metrics for the openinfer engines that connect.",
    )
    parser.add_argument(
        "--host",
        default="0.0.0.0",
        help="HTTP address to listen on (vLLM's default, every interface; a warning without an API key)",
    )
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    parser.add_argument(
        "--engine-bind",
        type=_engine_address,
        default="tcp://127.0.0.1:5555",
        help="tcp://HOST:PORT for engines: requests go out on PORT, outputs come in on PORT+1 (default: "
        "this host only; engines elsewhere need tcp://0.0.0.0:5555, and --zmq-curve-keys)",
    )
    parser.add_argument(
        "--api-key",
        default=env_key("OPENINFER_API_KEY", "VLLM_API_KEY"),
        help="require `Authorization: Bearer KEY` on every route but /health and /metrics (default: "
        "$OPENINFER_API_KEY, else $VLLM_API_KEY, which keep it out of `ps`; none when unset)",
    )
    parser.add_argument(
        "--admin-api-key",
        default=env_key("OPENINFER_ADMIN_API_KEY"),
        help="the key of the /admin routes, instead of --api-key (default: $OPENINFER_ADMIN_API_KEY); "
        "without either they are off",
    )
    add_frontend_args(parser)
    parser.add_argument(
        "--zmq-curve-keys",
        type=Path,
        metavar="DIR",
        help="CurveZMQ: encrypt the engine sockets and admit only engines whose public key is in "
        "DIR/engines (keys made by openinfer-keys DIR)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    try:
        args.chat_parsers = chat_parsers(args)
    except ValueError as e:
        parser.error(str(e))
    if args.http_timeout_keep_alive is None:
        args.http_timeout_keep_alive = _keep_alive_from_env(parser)
    return args


def add_frontend_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Every flag about how the frontend serves, not where it listens or with which keys (those are
    :func:`parse_args`' own): ``openinfer-serve`` takes these and passes them on to its frontend as given."""
    parser.add_argument(
        "--engine-timeout",
        type=_positive_seconds,
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
        type=_positive_seconds,
        default=10.0,
        help='seconds between "SpecDecoding metrics" log lines (summed over engines; none without drafts)',
    )
    parser.add_argument(
        "--drafter-timeout",
        type=_positive_seconds,
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
        type=_positive_seconds,
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
    parser.add_argument(
        "--allowed-methods",
        type=_json_strings,
        default=["*"],
        metavar="JSON",
        help='with --allowed-origins: the methods they may use, a JSON list (default: ["*"], any)',
    )
    parser.add_argument(
        "--allowed-headers",
        type=_json_strings,
        default=["*"],
        metavar="JSON",
        help='with --allowed-origins: the request headers they may send, a JSON list (default: ["*"], any)',
    )
    parser.add_argument(
        "--allow-credentials",
        action="store_true",
        help="with --allowed-origins: their pages may send cookies and Authorization along",
    )
    parser.add_argument(
        "--http-timeout-keep-alive",
        type=_positive_seconds,
        default=None,  # from the environment, read after parsing so that a bad value is named as such
        metavar="SECONDS",
        help="close a connection whose next request's headers are not in within this many seconds of its "
        f"start or its last response, idle or half-sent (default: ${_KEEP_ALIVE_ENV}, else "
        f"{_KEEP_ALIVE_DEFAULT_S:g}, vLLM's); a response in progress is never cut",
    )
    parser.add_argument(
        "--http-timeout-body",
        type=_positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="answer 408 to a request whose body is not all in within this many seconds of its headers "
        "(default: 60; uvicorn, so vLLM, has no such bound)",
    )
    add_chat_parser_args(parser)
    add_structured_outputs_arg(parser)
    parser.add_argument(
        "--grammar-check-timeout",
        type=_positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="a structured-outputs constraint (JSON schema, regex, grammar) that xgrammar takes longer than "
        "this to compile is a 400, before it reaches an engine",
    )


def cors_policy(args: argparse.Namespace) -> CorsPolicy | None:
    """The CORS the flags ask for; None (no CORS headers) without --allowed-origins."""
    if not args.allowed_origins:
        return None
    return CorsPolicy(
        tuple(args.allowed_origins),
        tuple(args.allowed_methods),
        tuple(args.allowed_headers),
        args.allow_credentials,
    )


def env_key(*names: str) -> str | None:
    """The first of these environment variables that is set and not empty (empty means no key)."""
    return next((os.environ[name] for name in names if os.environ.get(name)), None)


def _engine_address(value: str) -> str:
    try:
        engine_addresses(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


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


def _keep_alive_from_env(parser: argparse.ArgumentParser) -> float:
    """--http-timeout-keep-alive's default: ``$VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, else 5; a usage error naming
    the variable when it holds something else than a positive number."""
    value = os.environ.get(_KEEP_ALIVE_ENV)
    if not value:
        return _KEEP_ALIVE_DEFAULT_S
    try:
        return _positive_seconds(value)
    except (ValueError, argparse.ArgumentTypeError):
        parser.error(
            f"${_KEEP_ALIVE_ENV} (the default of --http-timeout-keep-alive) must be a positive number of "
            f"seconds, got {value!r}: fix or unset it, or pass --http-timeout-keep-alive"
        )


def _positive_seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {value}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    """Run the frontend until SIGINT or SIGTERM; exit 1 with a clear message if it cannot start."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        failed = asyncio.run(_run(args))
    except (OSError, zmq.ZMQError, StateError, ValueError) as e:  # a port in use, unusable state or keys
        logger.error("openinfer-frontend could not start: %s", e)
        sys.exit(1)
    if failed:
        sys.exit(1)


async def _run(args: argparse.Namespace) -> bool:
    """Serve until a signal (False) or a failure that leaves the frontend unable to serve (True)."""
    failed = False
    curve_keys = load_server_keys(args.zmq_curve_keys) if args.zmq_curve_keys else None
    state_dir = StateDir(args.state_dir) if args.state_dir else None
    metrics = FrontendMetrics(state_dir)
    client = EngineClient(
        args.engine_bind,
        metrics,
        engine_timeout=args.engine_timeout,
        max_queued_per_engine=args.max_queued_per_engine,
        max_queued_total=args.max_queued_total,
        curve_keys=curve_keys,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    await client.start()
    _warn_exposure(args)
    spec_log = asyncio.create_task(metrics.spec_decode_log.run(args.spec_log_interval), name="spec-log")
    saver = asyncio.create_task(_save_periodically(metrics, args.state_interval), name="state-saver")
    try:
        app = build_app(
            client,
            metrics,
            args.api_key,
            args.per_request_spec_decode_metrics,
            args.drafter_timeout,
            args.chat_parsers,
            args.structured_outputs_config,
            args.admin_api_key,
            cors_policy(args),
            args.host if is_loopback_host(args.host) else None,
            args.grammar_check_timeout,
            args.http_timeout_body,
        )
        runner = await serve(app, args.host, args.port, args.http_timeout_keep_alive)
        try:
            logger.info("openinfer frontend listening on http://%s:%d", args.host, args.port)
            logger.info("engines connect to %s (requests) and %s (outputs)", *client.addresses)
            say_ready()  # to openinfer-serve, if it started this frontend
            crash = await _stop_or_crash(stop, client)
            if crash is not None:
                logger.critical("the frontend stops, as it can no longer serve: %s", crash)
                failed = True
            logger.info("shutting down")
        finally:
            await runner.cleanup()
    finally:
        spec_log.cancel()
        saver.cancel()
        await asyncio.gather(spec_log, saver, return_exceptions=True)
        await client.close()
        metrics.save()
        if state_dir is not None:
            state_dir.close()
    return failed


async def _stop_or_crash(stop: asyncio.Event, client: EngineClient) -> str | None:
    """Wait for ``stop``, or for the engine client to crash: None, or what crashed."""
    stopped = asyncio.create_task(stop.wait())
    crashed = asyncio.create_task(client.crashed())
    await asyncio.wait({stopped, crashed}, return_when=asyncio.FIRST_COMPLETED)
    crash = crashed.result() if crashed.done() else None
    for task in (stopped, crashed):
        task.cancel()
    await asyncio.gather(stopped, crashed, return_exceptions=True)
    return crash


def _warn_exposure(args: argparse.Namespace) -> None:
    """Loud warnings for what others could do: join as an engine, or use the API."""
    host, port = split_address(args.engine_bind)
    if args.zmq_curve_keys is None:
        who = "any process on this host" if is_loopback_host(host) else "anyone who can reach them"
        logger.warning(
            "SECURITY: the engine sockets listen on %s (ports %d and %d) without --zmq-curve-keys: %s can "
            "join as an engine, read every prompt and write every answer. Make keys with `openinfer-keys DIR "
            "--engines N` and give --zmq-curve-keys DIR here and to every engine (openinfer-serve does so "
            "by itself)",
            host,
            port,
            port + 1,
            who,
        )
    if not is_loopback_host(args.host) and args.api_key is None:
        logger.warning(
            "SECURITY: HTTP listens on %s:%d without an API key: anyone who can reach it can use the API, "
            "and any web page a user of this machine opens can too, by DNS rebinding (the Host check is only "
            "on for a loopback --host). Set OPENINFER_API_KEY (or --api-key), or listen on 127.0.0.1",
            args.host,
            args.port,
        )
    if "*" in args.allowed_origins and args.api_key is None:
        logger.warning(
            "SECURITY: --allowed-origins '[\"*\"]' without an API key: any web page a user of this machine "
            "opens can use the API through their browser. Name the origins you trust, or set OPENINFER_API_KEY"
        )


async def _save_periodically(metrics: FrontendMetrics, interval: float) -> None:
    """Save the state every ``interval`` seconds (when it changed), besides the saves before scrapes."""
    while True:
        await asyncio.sleep(interval)
        try:
            metrics.save()
        except OSError as e:
            logger.error("could not save the frontend state: %s", e)


if __name__ == "__main__":
    main()
