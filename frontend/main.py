"""``openinfer-frontend``: the OpenAI-compatible API process that engines connect to."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

import zmq

from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.api_server import build_app, serve
from openinfer.frontend.engine_client import EngineClient
from openinfer.frontend.metrics import FrontendMetrics
from openinfer.frontend.request_spec_metrics import PerRequestSpecMetrics

logger = logging.getLogger("openinfer.frontend")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="openinfer-frontend",
        description="Serve the OpenAI-compatible API and /metrics for the openinfer engines that connect.",
    )
    parser.add_argument("--host", default="0.0.0.0", help="HTTP address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    parser.add_argument(
        "--engine-bind",
        type=_engine_address,
        default="tcp://0.0.0.0:5555",
        help="tcp://HOST:PORT for engines: requests go out on PORT, outputs come in on PORT+1",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENINFER_API_KEY"),
        help="require `Authorization: Bearer KEY` on every route but /health and /metrics "
        "(default: $OPENINFER_API_KEY; none when unset)",
    )
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
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


def _engine_address(value: str) -> str:
    try:
        engine_addresses(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _per_request_spec_metrics(value: str) -> PerRequestSpecMetrics:
    try:
        return PerRequestSpecMetrics(value)
    except ValueError:
        modes = ", ".join(mode.value for mode in PerRequestSpecMetrics)
        raise argparse.ArgumentTypeError(f"choose one of {modes}; got {value!r}") from None


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
        asyncio.run(_run(args))
    except (OSError, zmq.ZMQError) as e:  # a port in use, an address that does not resolve
        logger.error("openinfer-frontend could not start: %s", e)
        sys.exit(1)


async def _run(args: argparse.Namespace) -> None:
    metrics = FrontendMetrics()
    client = EngineClient(args.engine_bind, metrics, engine_timeout=args.engine_timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    await client.start()
    spec_log = asyncio.create_task(metrics.spec_decode_log.run(args.spec_log_interval), name="spec-log")
    try:
        app = build_app(
            client, metrics, args.api_key, args.per_request_spec_decode_metrics, args.drafter_timeout
        )
        runner = await serve(app, args.host, args.port)
        try:
            logger.info("openinfer frontend listening on http://%s:%d", args.host, args.port)
            logger.info("engines connect to %s (requests) and %s (outputs)", *client.addresses)
            await stop.wait()
            logger.info("shutting down")
        finally:
            await runner.cleanup()
    finally:
        spec_log.cancel()
        await asyncio.gather(spec_log, return_exceptions=True)
        await client.close()


if __name__ == "__main__":
    main()
