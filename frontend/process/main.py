"""``openinfer-frontend``: the OpenAI-compatible API process that engines connect to."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
import time
from pathlib import Path

import zmq

from openinfer.frontend.addresses import engine_addresses, engine_ports, is_loopback_host, split_address
from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.server_keys import load_server_keys
from openinfer.frontend.metrics.api_servers import ApiServers
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.state_dir import StateDir, StateError
from openinfer.frontend.openai.api_server import build_app
from openinfer.frontend.openai.cors import CorsPolicy
from openinfer.frontend.openai.http_runner import serve
from openinfer.frontend.openai.parsers.chat_parsers import chat_parsers
from openinfer.frontend.process.flags import add_api_key_args, add_frontend_args, keep_alive_from_env
from openinfer.frontend.ready_pipe import say_ready

logger = logging.getLogger("openinfer.frontend")

# How long an api server waits for an engine to join it before it takes connections on the shared port
# anyway (they get 503 until one joins): the engines rejoin a restarted frontend within a heartbeat or two.
ENGINE_WAIT_S = 10.0


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
        "--listen-fd",
        type=int,
        metavar="FD",
        help="accept HTTP connections on this inherited listening socket, bound to --host:--port by "
        "openinfer-serve (which gives it), instead of binding them",
    )
    parser.add_argument(
        "--engine-bind",
        type=_engine_address,
        default="tcp://127.0.0.1:5555",
        help="tcp://HOST:PORT for engines: requests go out on PORT, outputs come in on PORT+1 (default: "
        "this host only; engines elsewhere need tcp://0.0.0.0:5555, and --zmq-curve-keys)",
    )
    add_api_key_args(parser)
    add_frontend_args(parser)
    parser.add_argument(
        "--zmq-curve-keys",
        type=Path,
        metavar="DIR",
        help="CurveZMQ: encrypt the engine sockets and admit only engines whose public key is in "
        "DIR/engines (keys made by openinfer-keys DIR)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_api_server_args(parser.add_argument_group("one of several api servers on one port (openinfer-serve)"))
    args = parser.parse_args(argv)
    if args.api_server_count > 1:
        if args.peers_dir is None or args.state_dir is None or args.listen_fd is None:
            parser.error(
                "--api-server-count > 1 needs --peers-dir, --state-dir and --listen-fd (openinfer-serve "
                "gives them)"
            )
        args.state_dir = args.state_dir / f"api-server-{args.api_server_index}"
    if not 0 <= args.api_server_index < args.api_server_count:
        parser.error(f"--api-server-index must be in 0..{args.api_server_count - 1}")
    try:
        args.chat_parsers = chat_parsers(args)
    except ValueError as e:
        parser.error(str(e))
    if args.http_timeout_keep_alive is None:
        args.http_timeout_keep_alive = keep_alive_from_env(parser)
    return args


def add_api_server_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--api-server-count",
        type=int,
        default=1,
        help="the frontends sharing --port over the same engines (vLLM's flag; openinfer-serve sets it): a "
        "scrape of any shows all of them",
    )
    group.add_argument("--api-server-index", type=int, default=0, help="this frontend's index among them")
    group.add_argument(
        "--peers-dir",
        type=Path,
        help="a folder only this user can read, where the api servers answer each other on Unix sockets",
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


def _engine_address(value: str) -> str:
    try:
        engine_addresses(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


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
    listener = None if args.listen_fd is None else socket.socket(fileno=args.listen_fd)
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
    api_servers = None
    if args.api_server_count > 1:
        api_servers = ApiServers(metrics, args.peers_dir, args.api_server_index, args.api_server_count)
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
            api_servers,
            chat_template_timeout=args.chat_template_timeout,
        )
        logger.info("engines connect to %s (requests) and %s (outputs)", *client.addresses)
        if api_servers is not None:
            await api_servers.start()
        say_ready()  # to openinfer-serve, if it started this frontend: it got through its start
        if api_servers is not None:  # on serve's socket the others take connections until it can serve
            await _until_an_engine_joined(client, stop)
        runner = await serve(app, args.host, args.port, args.http_timeout_keep_alive, listener)
        try:
            logger.info("openinfer frontend listening on http://%s:%d", args.host, args.port)
            crash = await _stop_or_crash(stop, client)
            if crash is not None:
                logger.critical("the frontend stops, as it can no longer serve: %s", crash)
                failed = True
            logger.info("shutting down")
        finally:
            await runner.cleanup()
            if api_servers is not None:
                await api_servers.close()
    finally:
        spec_log.cancel()
        saver.cancel()
        await asyncio.gather(spec_log, saver, return_exceptions=True)
        await client.close()
        metrics.save()
        if state_dir is not None:
            state_dir.close()
    return failed


async def _until_an_engine_joined(client: EngineClient, stop: asyncio.Event) -> None:
    """Until an engine joined this frontend, ``stop`` is set, or :data:`ENGINE_WAIT_S` passed."""
    deadline = time.monotonic() + ENGINE_WAIT_S
    while client.num_engines_up == 0 and not stop.is_set():
        if time.monotonic() >= deadline:
            logger.warning(
                "no engine joined within %g s: taking connections anyway (503 until one joins)", ENGINE_WAIT_S
            )
            return
        await asyncio.sleep(0.05)


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
    requests_port, outputs_port = engine_ports(port)
    if args.zmq_curve_keys is None:
        who = "any process on this host" if is_loopback_host(host) else "anyone who can reach them"
        logger.warning(
            "SECURITY: the engine sockets listen on %s (ports %d and %d) without --zmq-curve-keys: %s can "
            "join as an engine, read every prompt and write every answer. Make keys with `openinfer-keys DIR "
            "--engines N` and give --zmq-curve-keys DIR here and to every engine (openinfer-serve does so "
            "by itself)",
            host,
            requests_port,
            outputs_port,
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
