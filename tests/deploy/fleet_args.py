"""The command lines of a fleet (openinfer nodes behind vllm-router), read with the real parsers: a node's with
openinfer-serve's, the router's with vllm-router's own, and what must agree between them: the router's worker
URLs, KV event sources and block size name exactly the nodes, their HTTP ports and their KV event sockets."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any

from openinfer.engine_core.launch.serve_args import parse_args as parse_serve_args

# vLLM's KV events config, as every node in deploy/ gives it (the ports are the nodes' container ports).
KV_EVENTS = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": "tcp://*:5557",
    "replay_endpoint": "tcp://*:5558",
}


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
    """``argv`` (``openinfer-serve`` and its flags) parsed with openinfer-serve's parser, and its
    --kv-events-config (vLLM's JSON) read as a dict."""
    assert argv[0] == "openinfer-serve", argv
    args = parse_serve_args(argv[1:])
    assert args.kv_events_config is not None and args.kv_events_config.publishes, argv
    return Node(args, json.loads(argv[argv.index("--kv-events-config") + 1]))


def parse_router(argv: list[str]) -> Any:
    """vllm-router's command line (without the program name) as its launcher parses and validates it."""
    from vllm_router.launch_router import parse_router_args

    router = parse_router_args(argv)
    router._validate_router_args()  # what `vllm-router` runs before it starts
    # And what its Rust side refuses when it starts (not at parse): event sources under another policy, or
    # without a model.
    if router.kv_event_source or router.kv_event_replay_source:
        assert router.policy == "kv_aware", "vllm-router: --kv-event-source requires the kv_aware policy"
        assert router.kv_event_model, "vllm-router: static KV event sources require a model identity"
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
