"""The flags a single ``openinfer-bench`` run and a sweep share: what is sent and how, with ``vllm bench
serve``'s names (and the dataset's own ``--random-*``, ``--text-*``, ``--prefix-repetition-*`` and
``--multi-turn-*`` flags)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from openinfer.benchmarks.datasets import TEXT_DATASETS, DatasetConfig
from openinfer.benchmarks.request_client import ENDPOINTS
from openinfer.engine_core.builtin_model import builtin_text_path
from openinfer.engine_core.config import from_flags

# vLLM's --endpoint values, accepted so that scripts carry over.
ENDPOINT_ALIASES = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The flags a single run and a sweep share: what is sent and how (``vllm bench serve``'s names)."""
    group = parser.add_argument_group("workload")
    group.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json or its model folder: prompt lengths and random prompts "
        "(default: the built-in model's; a sweep's --model's)",
    )
    group.add_argument(
        "--num-prompts", type=int, default=16, help="requests in a run (multi_turn: conversations)"
    )
    group.add_argument("--seed", type=int, default=0, help="picks the prompts and the arrival times")
    group.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)"
    )
    group.add_argument("--ignore-eos", action="store_true", help="generate max tokens even past EOS (vLLM)")
    group.add_argument("--max-tokens", type=int, help="every request's output length, over the dataset's own")
    group.add_argument(
        "--endpoint", default="completions", help="completions or chat (vLLM's /v1/... paths also work)"
    )
    group.add_argument(
        "--request-rate", type=float, default=math.inf, help="Poisson arrivals per second (inf)"
    )
    group.add_argument("--random-input-len", type=int, default=64)
    group.add_argument("--random-output-len", type=int, default=64)
    group.add_argument(
        "--random-range-ratio", type=float, default=0.0, help="random lengths vary by ± this share"
    )
    group.add_argument("--text-input-len", type=int, default=64, help="text: prompt tokens")
    group.add_argument("--text-output-len", type=int, default=64, help="text: output tokens")
    group.add_argument(
        "--prefix-repetition-prefix-len",
        type=int,
        default=256,
        help="prefix_repetition: shared prefix tokens",
    )
    group.add_argument(
        "--prefix-repetition-suffix-len", type=int, default=256, help="prefix_repetition: tokens after it"
    )
    group.add_argument(
        "--prefix-repetition-num-prefixes",
        type=int,
        default=10,
        help="prefix_repetition: distinct prefixes (--num-prompts // this requests share each)",
    )
    group.add_argument("--prefix-repetition-output-len", type=int, default=128)
    group.add_argument(
        "--multi-turn-num-turns",
        type=int,
        default=4,
        help="multi_turn: turns per conversation (--num-prompts conversations)",
    )
    group.add_argument("--multi-turn-user-len", type=int, default=64, help="multi_turn: user message tokens")
    group.add_argument("--multi-turn-output-len", type=int, default=64, help="multi_turn: tokens per reply")
    group.add_argument("--num-warmups", type=int, default=1, help="uncounted requests before each run")
    group.add_argument("--request-timeout", type=float, default=600, help="seconds a stream may stay silent")
    group.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def dataset_config(args: argparse.Namespace, name: str, path: Path | None) -> DatasetConfig:
    """Dataset ``name`` with the workload flags; a text dataset given no file cuts the built-in text."""
    if path is None and name in TEXT_DATASETS:
        path = builtin_text_path()
    return from_flags(DatasetConfig, args, name=name, path=path)


def endpoint_name(parser: argparse.ArgumentParser, value: str) -> str:
    name = ENDPOINT_ALIASES.get(value, value)
    if name not in ENDPOINTS:
        parser.error(f"--endpoint {value!r}: use completions or chat")
    return name


def check_workload_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.request_rate <= 0:
        parser.error("--request-rate must be positive (inf: all at once)")
    if args.temperature < 0 or args.num_warmups < 0 or args.request_timeout <= 0:
        parser.error("--temperature and --num-warmups must be >= 0, --request-timeout > 0")
    args.endpoint = endpoint_name(parser, args.endpoint)
