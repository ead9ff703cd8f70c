"""``openinfer-serve``: a frontend and N local engines in one command, until Ctrl-C, SIGTERM or SIGHUP."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

from openinfer.engine_core.builtin_model import (
    BUILTIN_MODEL_NAME,
    BUILTIN_NUM_SPEC_TOKENS,
    builtin_target_folder,
)
from openinfer.engine_core.launch.http_listener import http_listener
from openinfer.engine_core.launch.local_cluster import ProcessGroup, python_module, wait_healthy
from openinfer.engine_core.launch.serve_args import parse_args
from openinfer.engine_core.launch.supervisor import Readiness, Supervisor
from openinfer.engine_core.process.engine_args import FAKE_MODEL_NAME, config_from_args, drafter_flags
from openinfer.engine_core.process.engine_args import parse_args as engine_args
from openinfer.frontend.engines.server_keys import make_keys
from openinfer.frontend.ready_pipe import ReadyPipe

__all__ = [
    "engine_command",
    "frontend_command",
    "frontend_env",
    "main",
    "parse_args",
    "prepare",
    "remove_private_keys",
    "resolve_builtin",
]
logger = logging.getLogger("openinfer.serve")
DEFAULT_K = BUILTIN_NUM_SPEC_TOKENS  # --num-spec-tokens when a drafter is on and K is not given


def resolve_builtin(args: argparse.Namespace) -> None:
    """Fill in what the built-in model implies: its folder and name, and, unless --no-spec or another
    drafter, its DSpark drafter with K = 7 (the fastest built-in drafter at every output length and load
    measured, docs/benchmarks.md; its z-lab DFlash one for --spec-method dflash). With a model (or
    --fake-model) nothing is assumed but what a --draft-model folder given without --spec-method says: its
    method (dspark or dflash) and its K."""
    builtin = args.model is None and not args.fake_model
    if builtin:
        args.model = str(builtin_target_folder())
        args.served_model_name = args.served_model_name or BUILTIN_MODEL_NAME
        if not args.no_spec and args.spec_method is None and args.draft_model is None:
            args.spec_method = "dspark"
    # as each engine fills them in (engine_args.py), so that every engine is told the same drafter
    method, k, folder = drafter_flags(args.spec_method, args.num_spec_tokens, args.draft_model, builtin)
    args.spec_method = method
    args.num_spec_tokens = DEFAULT_K if method is not None and k is None else k
    if args.draft_model is None and folder is not None:
        args.draft_model = str(folder)


def describe_speculation(args: argparse.Namespace) -> str:
    if args.spec_method is None:
        return "no speculative decoding"
    return f"speculative decoding: {args.spec_method} K={args.num_spec_tokens}"


def engine_bind(args: argparse.Namespace, api_server: int) -> str:
    """Api server ``api_server``'s engine address: each binds two ports, the first after the one before's."""
    return f"tcp://127.0.0.1:{args.engine_port + 2 * api_server}"


def engine_command(args: argparse.Namespace, index: int) -> list[str]:
    """Engine ``index``'s command line: its placement, its frontends (every api server; the first, which
    exports its metrics, is api server ``index mod N``), the model and drafter resolved, then every engine
    flag as it was given."""
    count = args.api_server_count
    frontends = [engine_bind(args, (index + i) % count) for i in range(count)]
    command = python_module(
        "openinfer.engine_core.process.engine_cli",
        "--engine-index",
        str(index),
        "--frontend",
        *frontends,
        "--log-level",
        args.log_level,
    )
    command += ["--gpu", engine_gpus(args, index)] if args.device == "cuda" else ["--device", "cpu"]
    for flag, value in (
        ("--model", args.model),
        ("--served-model-name", args.served_model_name),
        ("--spec-method", args.spec_method),
        ("--num-spec-tokens", args.num_spec_tokens),
        ("--draft-model", args.draft_model),
        ("--zmq-curve-keys", args.zmq_curve_keys),
    ):
        if value is not None:
            command.append(f"{flag}={value}")
    if args.spec_log_dir:
        command.append(f"--spec-log={args.spec_log_dir}/spec-engine{index}.jsonl")
    return command + args.engine_argv


def engine_gpus(args: argparse.Namespace, index: int) -> str:
    """Engine ``index``'s GPUs under ``--device cuda``: GPU i for engine i, or with ``--tensor-parallel-size
    N`` its N ranks' GPUs i*N ... i*N + N - 1 ("2,3")."""
    size = max(args.tensor_parallel_size, 1)  # (below 1: the engine's config refuses it, naming the flag)
    return ",".join(str(index * size + rank) for rank in range(size))


def frontend_command(
    args: argparse.Namespace, api_server: int = 0, listen_fd: int | None = None
) -> list[str]:
    """Api server ``api_server``'s command line: where it listens (``listen_fd``: on serve's socket, which
    it inherits), then every frontend flag as it was given. Never the API key: :func:`frontend_env` carries
    it."""
    command = python_module(
        "openinfer.frontend.process.main",
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--engine-bind",
        engine_bind(args, api_server),
        "--log-level",
        args.log_level,
    )
    if listen_fd is not None:
        command.append(f"--listen-fd={listen_fd}")
    if args.zmq_curve_keys is not None:
        command.append(f"--zmq-curve-keys={args.zmq_curve_keys}")
    if args.api_server_count > 1:
        command += [
            f"--api-server-count={args.api_server_count}",
            f"--api-server-index={api_server}",
            f"--peers-dir={args.peers_dir}",
        ]
        if (
            args.state_dir is None
        ):  # the view a scrape shows of a dead api server is one its restart continues
            command.append(f"--state-dir={args.peers_dir / 'state'}")
    return command + args.frontend_argv


def frontend_env(args: argparse.Namespace) -> dict[str, str] | None:
    """What the frontend's environment adds to this one's: the API keys, where no other process's
    command line (``ps``) shows it."""
    env = {"OPENINFER_API_KEY": args.api_key, "OPENINFER_ADMIN_API_KEY": args.admin_api_key}
    return {name: key for name, key in env.items() if key} or None


def curve_keys(folder: Path, engines: int) -> None:
    """Make the frontend's and ``engines`` engines' CurveZMQ keys in ``folder`` unless it has keys; refuse a
    folder without a key for every engine (ValueError)."""
    if not (folder / "frontend.key").exists():
        make_keys(folder, engines)
        logger.info("made CurveZMQ keys for the frontend and %d engine(s) in %s", engines, folder)
        return
    missing = [i for i in range(engines) if not (folder / "engines" / f"engine-{i}.key_secret").is_file()]
    if missing:
        raise ValueError(
            f"--zmq-curve-keys {folder} has no key for engine(s) {', '.join(map(str, missing))}: make "
            f"keys for {engines} engines in an empty folder (openinfer-keys DIR --engines {engines})"
        )


def served_models(url: str, args: argparse.Namespace) -> str:
    """The models the frontend lists, for the announcement; the name the engines were given when the frontend
    cannot say (it died right after it answered /health, and is being started again)."""
    request = urllib.request.Request(f"{url}/v1/models")
    if args.api_key:
        request.add_header("Authorization", f"Bearer {args.api_key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return ", ".join(m["id"] for m in json.load(response)["data"])
    except (OSError, ValueError, KeyError, TypeError):
        return str(args.served_model_name or args.model or FAKE_MODEL_NAME)  # as the engines resolve it


def private_curve_keys(engines: int) -> Path:
    """CurveZMQ keys for this run's frontend and ``engines`` engines in a new folder only this user can
    read (0700; secret key files 0600), so that the engine ports admit only the engines serve starts. The
    caller removes it (:func:`remove_private_keys`)."""
    folder = Path(tempfile.mkdtemp(prefix="openinfer-keys-"))
    try:
        make_keys(folder, engines)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def remove_private_keys(args: argparse.Namespace) -> None:
    """Remove the keys :func:`prepare` made for this run, if it made them (never a --zmq-curve-keys DIR), and
    the api servers' folder."""
    for folder in (args.private_keys, args.peers_dir):
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def prepare(args: argparse.Namespace) -> None:
    """Resolve the built-in defaults, check an engine's flags as it will read them, and set up CurveZMQ:
    the keys in --zmq-curve-keys DIR (made there when it has none), else keys made for this run in a
    private folder, ``args.private_keys``, which lasts as long as serve (restarted children use it too); with
    several api servers, their private folder ``args.peers_dir`` as well.
    ValueError or OSError for what cannot start."""
    resolve_builtin(args)
    args.peers_dir = None
    config_from_args(engine_args(engine_command(args, 0)[3:]))  # after `python -m module`
    args.private_keys = None
    if args.api_server_count > 1:  # their Unix sockets, views and (without --state-dir) states; 0700
        args.peers_dir = Path(tempfile.mkdtemp(prefix="openinfer-api-servers-"))
    if args.zmq_curve_keys is not None:
        curve_keys(args.zmq_curve_keys, args.engines)
        return
    args.zmq_curve_keys = args.private_keys = private_curve_keys(args.engines)
    logger.info("engine sockets: CurveZMQ, with keys made for this run (--zmq-curve-keys DIR to give yours)")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``openinfer-serve``."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s serve %(levelname)s %(message)s")
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # A closed terminal (SIGHUP) stops serve as Ctrl-C does, so that its private keys folder is removed;
    # unless SIGHUP is ignored (nohup), as then its parent asked for serve to outlive the terminal.
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, on_signal)
    try:  # first: only this serve's api servers take connections on its port (http_listener.py)
        listener = http_listener(args.host, args.port)
    except OSError as e:
        logger.error("openinfer did not start: %s", e)
        sys.exit(1)
    try:
        prepare(args)
    except (ValueError, OSError) as e:
        logger.error("%s", e)
        sys.exit(2)
    children = ProcessGroup()  # they share this process's output
    try:
        with listener, ExitStack() as stack:
            ready = [stack.enter_context(ReadyPipe()) for _ in range(args.api_server_count)]
            supervisor = Supervisor(children, args.restart_policy)
            exit_code = run(args, supervisor, ready, listener.fileno(), lambda: stopping)
    finally:
        children.stop()
        remove_private_keys(args)
    logger.info("openinfer stopped")
    sys.exit(exit_code)


def run(
    args: argparse.Namespace,
    supervisor: Supervisor,
    ready: list[ReadyPipe],
    listen_fd: int,
    stopping: Callable[[], bool],
) -> int:
    """Start the frontend (its api servers accept on ``listen_fd``, serve's listening socket) and the engines
    and watch them until ``stopping()`` (exit status 0) or a reason to stop everything, logged (1). The
    caller stops the children."""
    url = f"http://{args.host}:{args.port}"
    # A frontend that dies once it got ready is started again on the same socket and ports; the engines keep
    # running and reconnect to it. One that dies before cannot start (its log says why): everything stops.

    def supervise() -> None:  # an engine that dies while the others start is started again, as later
        if (reason := supervisor.poll()) is not None:
            raise RuntimeError(reason)

    try:
        for i, pipe in enumerate(ready):
            env = {**(frontend_env(args) or {}), **pipe.env}
            listening = Readiness(f"listening on {url}", pipe.said_ready)
            name = "the frontend" if args.api_server_count == 1 else f"api server {i}"
            command = frontend_command(args, i, listen_fd)
            supervisor.start(name, command, env, listening, (*pipe.pass_fds, listen_fd))
        for i in range(args.engines):
            supervisor.start(f"engine {i}", engine_command(args, i), None)
        if not wait_healthy(url, supervisor.group, args.engines, args.startup_timeout, stopping, supervise):
            return 0  # stopping
    except RuntimeError as e:  # a child could not start, or died too often (its log says why)
        logger.error("openinfer did not start: %s", e)
        return 1
    except TimeoutError:
        logger.error(
            "openinfer did not start: not healthy at %s/health after --startup-timeout %g s; stopping",
            url,
            args.startup_timeout,
        )
        return 1
    logger.info(
        "openinfer is serving %s at %s/v1 with %d engine(s) and %d api server(s), %s; Ctrl-C stops it",
        served_models(url, args),
        url,
        args.engines,
        args.api_server_count,
        describe_speculation(args),
    )
    while not stopping():
        if (reason := supervisor.poll()) is not None:
            logger.error("%s", reason)
            return 1
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    main()
