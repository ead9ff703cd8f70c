"""What the restart benchmarks (``engine_restart``, ``frontend_restart``) share: their flags, the serve flags
those imply, and ``openinfer-serve`` started with them."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openinfer.engine_core.launch.local_cluster import LocalCluster


def restart_args(description: str) -> tuple[argparse.Namespace, list[str]]:
    """The benchmark's flags and serve's: the arguments it does not know, then the served model's name and KV
    cache, ``--engines`` and a restart backoff whose cap is the backoff itself (later trials wait no longer),
    with ``--trials`` + 1 restarts allowed. ``args.model_name`` is the name to request."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4, help="streaming clients, all the time")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--engine-restart-backoff", type=float, default=1.0, help="serve's, the default 1 s")
    parser.add_argument("--log-dir", type=Path, help="the processes' logs (default: a temporary folder)")
    args, serve_flags = parser.parse_known_args()
    args.model_name = "fake" if "--fake-model" in serve_flags else "openinfer-tiny-qwen3"
    if "--fake-model" in serve_flags:
        serve_flags += ["--served-model-name", "fake", "--num-kv-blocks", "4096"]
    else:
        serve_flags += ["--kv-cache-gb", "0.25"]
    backoff = str(args.engine_restart_backoff)
    serve_flags += ["--engines", str(args.engines), "--engine-restart-backoff", backoff]
    serve_flags += ["--engine-restart-backoff-max", backoff, "--engine-restart-limit", str(args.trials + 1)]
    return args, serve_flags


@contextmanager
def serving(
    log_dir: Path, serve_flags: list[str], args: argparse.Namespace
) -> Iterator[tuple[LocalCluster, int]]:
    """``openinfer-serve`` with ``serve_flags``, healthy with every engine up; yields its cluster and its pid,
    and stops it on leaving."""
    cluster = LocalCluster(log_dir)
    try:
        serve = cluster.start_serve(*serve_flags)
        cluster.wait_healthy(300, engines=args.engines)
        print(f"openinfer-serve {' '.join(serve_flags)}; {args.clients} streaming clients; logs in {log_dir}")
        yield cluster, serve.pid
    finally:
        cluster.stop(30)
