"""``openinfer-serve``: a frontend and N local engines in one command, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
import urllib.error
import urllib.request
from types import FrameType
from typing import get_args

from openinfer.engine_core.builtin_model import (
    BUILTIN_MODEL_NAME,
    BUILTIN_NUM_SPEC_TOKENS,
    builtin_drafter_folder,
    builtin_target_folder,
)
from openinfer.engine_core.config import ATTENTION_BACKENDS
from openinfer.engine_core.local_cluster import ProcessGroup, python_module, wait_healthy
from openinfer.frontend.openai.parsers.chat_parsers import (
    add_chat_parser_args,
    chat_parser_argv,
    chat_parsers,
)
from openinfer.frontend.openai.structured_options import add_structured_outputs_arg
from openinfer.protocol import DrafterMethod

logger = logging.getLogger("openinfer.serve")
DEFAULT_K = BUILTIN_NUM_SPEC_TOKENS  # --num-spec-tokens when a drafter is on and K is not given


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="openinfer-serve", description=__doc__)
    parser.add_argument(
        "--model",
        help="Hugging Face Qwen3 folder (default: the built-in tiny model, with its DFlash drafter)",
    )
    parser.add_argument("--served-model-name")
    parser.add_argument("--engines", type=int, default=1, help="number of local engine processes")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cpu, or cuda: engine i runs on GPU i"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights and KV cache of every engine (auto: float32 on the CPU, bfloat16 on CUDA)",
    )
    parser.add_argument(
        "--attention-backend",
        default="auto",
        choices=ATTENTION_BACKENDS,
        help="every engine's attention (auto: triton on CUDA, torch on the CPU)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--engine-port",
        type=int,
        default=5555,
        help="the frontend's engine ports: requests on this one, outputs on the next",
    )
    parser.add_argument("--api-key")
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument(
        "--spec-method",
        choices=get_args(DrafterMethod),
        help="drafter for every engine (default: dflash with the built-in model, none with --model)",
    )
    parser.add_argument(
        "--num-spec-tokens", type=int, help=f"K, draft tokens per round (at most 32; default {DEFAULT_K})"
    )
    parser.add_argument(
        "--draft-model", help="DFlash checkpoint folder (default with the built-in model: its drafter)"
    )
    parser.add_argument("--no-spec", action="store_true", help="no speculative decoding")
    parser.add_argument("--enforce-eager", action="store_true", help="engines run without CUDA graphs")
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engines reuse the KV of cached prompt prefixes (on by default)",
    )
    parser.add_argument("--spec-log-dir", help="each engine appends its spec log to DIR/spec-engine<i>.jsonl")
    parser.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for /health")
    add_chat_parser_args(parser)  # the frontend's
    add_structured_outputs_arg(parser)
    parser.add_argument(
        "--log-level", default="info", type=str.lower, choices=["debug", "info", "warning", "error"]
    )
    args = parser.parse_args(argv)
    if args.engines < 1:
        parser.error("--engines must be >= 1")
    if args.no_spec and (args.spec_method or args.num_spec_tokens is not None or args.draft_model):
        parser.error(
            "--no-spec turns speculation off: drop --spec-method, --num-spec-tokens and --draft-model"
        )
    drafter_options = args.num_spec_tokens is not None or args.draft_model
    if args.model is not None and args.spec_method is None and drafter_options:
        parser.error("--num-spec-tokens and --draft-model need --spec-method ngram|dflash")
    try:
        chat_parsers(args)
    except ValueError as e:
        parser.error(str(e))
    return args


def resolve_builtin(args: argparse.Namespace) -> None:
    """Fill in what the built-in model implies: its folder and name, and, unless --no-spec or another
    method, its DFlash drafter with K = 7. With --model nothing is assumed."""
    if args.model is None:
        args.model = str(builtin_target_folder())
        args.served_model_name = args.served_model_name or BUILTIN_MODEL_NAME
        if not args.no_spec and args.spec_method is None:
            args.spec_method = "dflash"
        if args.spec_method == "dflash" and args.draft_model is None:
            args.draft_model = str(builtin_drafter_folder())
    if args.spec_method is not None and args.num_spec_tokens is None:
        args.num_spec_tokens = DEFAULT_K


def describe_speculation(args: argparse.Namespace) -> str:
    if args.spec_method is None:
        return "no speculative decoding"
    return f"speculative decoding: {args.spec_method} K={args.num_spec_tokens}"


def engine_command(args: argparse.Namespace, index: int) -> list[str]:
    command = python_module(
        "openinfer.engine_core.engine_process",
        "--model",
        args.model,
        "--engine-index",
        str(index),
        "--frontend",
        f"tcp://127.0.0.1:{args.engine_port}",
        "--kv-cache-gb",
        str(args.kv_cache_gb),
        "--dtype",
        args.dtype,
        "--attention-backend",
        args.attention_backend,
        "--log-level",
        args.log_level,
    )
    command += ["--gpu", str(index)] if args.device == "cuda" else ["--device", "cpu"]
    if args.served_model_name:
        command += ["--served-model-name", args.served_model_name]
    if args.max_model_len:
        command += ["--max-model-len", str(args.max_model_len)]
    if args.spec_method:
        command += ["--spec-method", args.spec_method]
    if args.num_spec_tokens is not None:
        command += ["--num-spec-tokens", str(args.num_spec_tokens)]
    if args.draft_model:
        command += ["--draft-model", args.draft_model]
    if args.enforce_eager:
        command.append("--enforce-eager")
    if not args.enable_prefix_caching:
        command.append("--no-enable-prefix-caching")
    if args.spec_log_dir:
        command += ["--spec-log", f"{args.spec_log_dir}/spec-engine{index}.jsonl"]
    return command


def frontend_command(args: argparse.Namespace) -> list[str]:
    command = python_module(
        "openinfer.frontend.main",
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--engine-bind",
        f"tcp://127.0.0.1:{args.engine_port}",
        "--log-level",
        args.log_level,
    )
    if args.api_key:
        command += ["--api-key", args.api_key]
    return command + chat_parser_argv(chat_parsers(args)) + args.structured_outputs_config.argv()


def model_names(url: str, api_key: str | None) -> list[str]:
    request = urllib.request.Request(f"{url}/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return [m["id"] for m in json.load(response)["data"]]


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``openinfer-serve``."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s serve %(levelname)s %(message)s")
    try:
        resolve_builtin(args)
    except FileNotFoundError as e:
        logger.error("%s", e)
        sys.exit(2)

    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    children = ProcessGroup()  # they share this process's output
    children.spawn("the frontend", frontend_command(args))
    for i in range(args.engines):
        children.spawn(f"engine {i}", engine_command(args, i))
    url = f"http://{args.host}:{args.port}"
    exit_code = 0
    try:
        try:
            healthy = wait_healthy(url, children, 1, args.startup_timeout, abort=lambda: stopping)
        except (RuntimeError, TimeoutError):
            healthy = False
        if not healthy:
            if not stopping:
                logger.error("openinfer did not become healthy at %s/health; stopping", url)
                exit_code = 1
        else:
            served = ", ".join(model_names(url, args.api_key))
            logger.info(
                "openinfer is serving %s at %s/v1 with %d engine(s), %s; Ctrl-C stops it",
                served,
                url,
                args.engines,
                describe_speculation(args),
            )
        while not stopping and exit_code == 0:
            dead = children.exited()
            if dead is not None:
                logger.error("%s exited with code %s; stopping everything", *dead)
                exit_code = 1
                break
            time.sleep(0.2)
    finally:
        children.stop()
    logger.info("openinfer stopped")
    sys.exit(exit_code)


if __name__ == "__main__":
    main()
