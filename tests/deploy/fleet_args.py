"""The command lines of a fleet (openinfer nodes behind vllm-router), read with the real parsers: a node's with
openinfer-serve's, the router's with vllm-router's own, and what must agree between them: the router's worker
URLs, KV event sources and block size name exactly the nodes, their HTTP ports and their KV event sockets."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any

from openinfer.engine_core.launch.serve_args import build_parser
from openinfer.engine_core.launch.serve_args import parse_args as parse_serve_args

KV_EVENTS_FLAG = "--kv-events-config"
# vLLM's KV events config, as every node in deploy/ gives it (the ports are the nodes' container ports).
KV_EVENTS = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": "tcp://*:5557",
    "replay_endpoint": "tcp://*:5558",
}


def serve_knows_kv_events() -> bool:
    """Whether openinfer-serve accepts vLLM's --kv-events-config (engine KV events, issue 42)."""
    return KV_EVENTS_FLAG in build_parser()[0].format_help()


@dataclass
class Node:
    """A node's openinfer-serve command line, parsed, and its KV event config."""

    args: argparse.Namespace
    kv_events: dict[str, Any]

    def url(self, host: str) -> str:
        return f"http://{host}:{self.args.port}"

    def kv_endpoint(self, host: str, key: str = "endpoint") -> str:
        """The endpoint a router connects to for engine 0's socket (``endpoint`` or ``replay_endpoint``)."""
        port = re.fullmatch(r"tcp://\*:(\d+)", self.kv_events[key])
        assert port, self.kv_events[key]
        return f"tcp://{host}:{port.group(1)}"


def parse_node(argv: list[str]) -> Node:
    """``argv`` (``openinfer-serve`` and its flags) parsed with openinfer-serve's parser. Its --kv-events-config
    is vLLM's JSON; until openinfer-serve knows the flag, it is read here and left out of the parse."""
    assert argv[0] == "openinfer-serve", argv
    args = argv[1:]
    at = args.index(KV_EVENTS_FLAG)
    kv_events = json.loads(args[at + 1])
    if not serve_knows_kv_events():
        args = args[:at] + args[at + 2 :]
    return Node(parse_serve_args(args), kv_events)


def parse_router(argv: list[str]) -> Any:
    """vllm-router's command line (without the program name) as its launcher parses and validates it."""
    from vllm_router.launch_router import parse_router_args

    router = parse_router_args(argv)
    router._validate_router_args()  # what `vllm-router` runs before it starts
    return router


def check_router_names_nodes(router: Any, nodes: dict[str, Node]) -> None:
    """The router's workers are exactly ``nodes`` (host name -> node), in order, each with its KV event
    socket and replay socket; it hashes blocks of the nodes' size and indexes them as the nodes' model."""
    assert router.worker_urls == [node.url(host) for host, node in nodes.items()]
    assert router.kv_event_source == [
        f"{node.url(host)}={node.kv_endpoint(host)}" for host, node in nodes.items()
    ]
    assert router.kv_event_replay_source == [
        f"{node.url(host)}={node.kv_endpoint(host, 'replay_endpoint')}" for host, node in nodes.items()
    ]
    assert {node.args.block_size for node in nodes.values()} == {router.kv_event_block_size}
    assert {node.args.served_model_name for node in nodes.values()} == {router.kv_event_model}
    for node in nodes.values():
        assert node.kv_events == KV_EVENTS
        assert node.args.engines == 1  # one engine: its sockets are the config's ports themselves
