"""Several ``openinfer-serve`` nodes behind a PyPI router, on loopback: what the router tests and the fleet
benchmark run.

Each node serves the built-in model and publishes its KV events (``--kv-events-config``, PUB and replay on
loopback ports of its own); the router is ``vllm-router`` with one policy, told where each node's events are
(``--kv-event-source``) under ``kv_aware``. Everything is started on free ports and stopped by pid.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families

from openinfer.engine_core.builtin_model import BUILTIN_MODEL_NAME
from openinfer.engine_core.launch.local_cluster import (
    HOST,
    LocalCluster,
    ProcessGroup,
    answers_health,
    free_port,
    free_port_pair,
)
from openinfer.tools.spec_tally import scrape_metrics

ROUTER = "vllm-router"
POLICIES = ("kv_aware", "cache_aware", "round_robin")
STOP_TIMEOUT_S = 30.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def router_binary() -> str | None:
    """vllm-router's console script: beside this interpreter (a venv's bin), else on PATH; None if absent."""
    beside = Path(sys.executable).parent / ROUTER
    return str(beside) if beside.exists() else shutil.which(ROUTER)


@dataclass
class Node:
    """One ``openinfer-serve``: its HTTP URL and its engine's KV-event endpoints."""

    cluster: LocalCluster
    events: str  # tcp://127.0.0.1:PORT, the PUB
    replay: str  # its replay ROUTER

    @property
    def url(self) -> str:
        return self.cluster.url


def start_node(log_dir: Path, *flags: str) -> Node:
    """A node with KV events on two free loopback ports and its engines' spec logs in ``log_dir/spec-logs``
    (not yet waited for: see :meth:`Fleet.__enter__`)."""
    port = free_port_pair()
    events, replay = f"tcp://{HOST}:{port}", f"tcp://{HOST}:{port + 1}"
    config = {"enable_kv_cache_events": True, "endpoint": events, "replay_endpoint": replay}
    cluster = LocalCluster(log_dir)
    spec_logs = ["--spec-log-dir", str(log_dir / "spec-logs")]
    cluster.start_serve(
        "--kv-events-config", json.dumps(config), "--log-level", "warning", *spec_logs, *flags
    )
    return Node(cluster, events, replay)


class Fleet:
    """``nodes`` nodes and, for a ``policy``, vllm-router in front of them; a context manager (entering waits
    until every node serves and the router answers)."""

    def __init__(self, log_dir: Path, nodes: int, policy: str | None, *node_flags: str) -> None:
        self.log_dir = log_dir
        self.nodes = [start_node(log_dir / f"node{i}", *node_flags) for i in range(nodes)]
        self.policy = policy
        self.router = ProcessGroup(log_dir / "router")
        self.router_url = ""  # set by start_router, on ports free then (a stopped router's may linger)

    def __enter__(self) -> Fleet:
        try:
            for node in self.nodes:
                node.cluster.wait_healthy(120.0)
            if self.policy is not None:
                self.start_router(self.policy)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Where clients send requests: the router, or the only node when there is none."""
        return self.router_url if self.policy is not None else self.nodes[0].url

    def start_router(self, policy: str) -> None:
        """vllm-router with ``policy`` in front of the nodes (until :meth:`stop_router`)."""
        self.policy = policy
        binary = router_binary()
        if binary is None:
            raise FileNotFoundError(f"{ROUTER} is not installed (pip install vllm-router)")
        port = free_port()
        self.router_url = f"http://{HOST}:{port}"
        argv = [binary, "--host", HOST, "--port", str(port), "--policy", policy, "--log-level", "debug"]
        argv += ["--prometheus-host", HOST, "--prometheus-port", str(free_port())]
        argv += ["--worker-urls", *(node.url for node in self.nodes)]
        if policy == "kv_aware":
            for node in self.nodes:
                argv += ["--kv-event-source", f"{node.url}={node.events}"]
                argv += ["--kv-event-replay-source", f"{node.url}={node.replay}"]
            argv += ["--kv-event-block-size", "16", "--kv-event-model", BUILTIN_MODEL_NAME]
        self.router.spawn("router", argv, env={"NO_COLOR": "1"})
        deadline = time.monotonic() + 60
        while not answers_health(self.router_url):  # vllm-router listens once its workers are healthy
            self.router.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ROUTER} did not answer in 60 s:\n{self.router.logs()}")
            time.sleep(0.1)

    def stop_router(self) -> None:
        self.router.stop(STOP_TIMEOUT_S)
        self.router = ProcessGroup(self.log_dir / f"router-after-{self.policy}")
        self.policy = None

    def router_log(self) -> str:
        assert self.router.log_dir is not None
        return _ANSI.sub("", (self.router.log_dir / "router.log").read_text(errors="replace"))

    def router_applied(self, node: Node) -> int:
        """The last KV-event sequence number of ``node``'s engine the router has applied (-1: none)."""
        pattern = rf"sequence advanced source={re.escape(node.url)} rank=0 seq=(\d+)"
        return max((int(seq) for seq in re.findall(pattern, self.router_log())), default=-1)

    def served(self) -> list[int]:
        """Requests each node has finished (its ``vllm:request_success_total``, over every reason)."""
        return [finished_requests(node.url) for node in self.nodes]

    def stop(self) -> None:
        self.router.stop(STOP_TIMEOUT_S)
        for node in self.nodes:
            node.cluster.stop(STOP_TIMEOUT_S)


def finished_requests(url: str) -> int:
    text = scrape_metrics(f"{url}/metrics")
    return round(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "vllm:request_success_total"
        )
    )
