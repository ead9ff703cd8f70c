"""The engine flags vLLM gives as a level or a JSON object: ``-O`` and ``--compilation-config`` (the compiled
model step) and ``--kv-events-config`` (KV events for routers); without torch, like the rest of the flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from openinfer.engine_core.compilation_config import DEFAULT_LEVEL, MAX_LEVEL, read_compilation_config
from openinfer.engine_core.kv_events_config import read_kv_events_config

T = TypeVar("T")


def add_vllm_json_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``-O``, ``--compilation-config`` and ``--kv-events-config``, each JSON refused as a usage error naming
    what is wrong with it."""
    parser.add_argument(
        "-O",
        "--optimization-level",
        dest="optimization_level",
        type=int,
        choices=range(MAX_LEVEL + 1),
        metavar="LEVEL",
        help=f"vLLM's -O0..-O{MAX_LEVEL}: 0 runs the model step eagerly, 1-{MAX_LEVEL} compile it with "
        f"torch.compile (inductor), the same at each; default {DEFAULT_LEVEL} (README: Compiled model step)",
    )
    parser.add_argument(
        "--compilation-config",
        type=_usage_error(read_compilation_config),
        metavar="JSON",
        help='vLLM\'s JSON: {"level": 0-3 (or "mode"), "cache_dir": where compiled artifacts are kept '
        "(default ~/.cache/openinfer/torch_compile)}; -O's level wins over its own",
    )
    parser.add_argument(
        "--kv-events-config",
        type=_usage_error(read_kv_events_config),
        metavar="JSON",
        help="publish the prefix cache's changes as vLLM's KV events, for routers that route by them (vLLM's "
        'flag and JSON: {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558"}; engine i takes each port + i)',
    )


def _usage_error(read: Callable[[str], T]) -> Callable[[str], T]:
    """``read`` as an argparse type: its ValueError becomes the usage error, with its message."""

    def parse(text: str) -> T:
        try:
            return read(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse
