"""A fleet in containers, laid out as deploy/docker-compose.fleet.yml lays it out: openinfer nodes (the CPU image
running openinfer-serve with the built-in model and its DFlash drafter, each writing its spec log and
publishing KV events) and vllm-router's image in front of them, on the host's network (loopback, free
ports). Containers are started and removed through tests/deploy/containers.py, by id."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from openinfer.engine_core.launch.local_cluster import HOST, free_port_pair, free_ports
from tests.deploy.containers import Containers
from tests.deploy.fleet_args import KV_EVENTS
from tests.deploy.stack import get_json

MODEL = "tiny"  # the served model name
BLOCK_SIZE = 16


def ports(count: int, pairs: int) -> tuple[list[int], list[int]]:
    """``count`` free ports and ``pairs`` engine ports (each with the next one free too), all distinct."""
    single, first = free_ports(count)
    engine = [first]
    while len(engine) < pairs:
        port = free_port_pair()
        if not {port, port + 1} & {*single, *engine, *(p + 1 for p in engine)}:
            engine.append(port)
    return single, engine


class FleetNode:
    """One node: ``openinfer-serve --engines 1`` on the CPU image, its spec log in ``log_dir``."""

    def __init__(
        self, containers: Containers, image: str, log_dir: Path, index: int, k: int, port_set: list[int]
    ) -> None:
        self.name = f"node-{index}"
        self.http_port, self.kv_port, self.replay_port, self.engine_port = port_set
        self.url = f"http://{HOST}:{self.http_port}"
        log_dir.mkdir()
        log_dir.chmod(0o777)  # written by the image's user
        self.spec_log = log_dir / "spec-engine0.jsonl"
        args = [
            *("--device", "cpu", "--engines", "1", "--host", HOST, "--port", str(self.http_port)),
            *("--engine-port", str(self.engine_port), "--served-model-name", MODEL, "--kv-cache-gb", "0.05"),
            *("--spec-method", "dflash", "--num-spec-tokens", str(k), "--spec-log-dir", "/logs"),
            *("--block-size", str(BLOCK_SIZE), "--state-dir", "/state"),
        ]
        ports = {"endpoint": f"tcp://*:{self.kv_port}", "replay_endpoint": f"tcp://*:{self.replay_port}"}
        args += ["--kv-events-config", json.dumps({**KV_EVENTS, **ports})]
        mounts = ((log_dir, "/logs", "rw"),)
        containers.start(self.name, image, args, mounts=mounts, options=("--entrypoint", "openinfer-serve"))

    def healthy(self) -> bool:
        try:
            return int(get_json(f"{self.url}/health", timeout=1)["engines_up"]) >= 1
        except (urllib.error.URLError, OSError, KeyError):
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def requests_served(self) -> float:
        """Requests this node finished (its frontend's vllm:request_success_total, every reason)."""
        return sum(
            float(v) for v in re.findall(r"^vllm:request_success_total\{.*\} (\S+)$", self.metrics(), re.M)
        )


class RouterContainer:
    """vllm-router on loopback in front of ``nodes``, with the fleet file's arguments (under kv_aware the KV
    event sources and replay sources; block size, model) and its Prometheus metrics on a port of its own. Its
    root filesystem is read-only, as deploy/kubernetes/router-deployment.yaml runs it."""

    def __init__(
        self, containers: Containers, image: str, nodes: list[FleetNode], policy: str, port_set: list[int]
    ) -> None:
        self.containers = containers
        self.port, self.metrics_port = port_set
        self.url = f"http://{HOST}:{self.port}"
        self.nodes = nodes
        args = [
            *("--host", HOST, "--port", str(self.port), "--policy", policy),
            *("--worker-urls", *(node.url for node in nodes)),
            *("--kv-event-block-size", str(BLOCK_SIZE), "--kv-event-model", MODEL),
            *("--prometheus-host", HOST, "--prometheus-port", str(self.metrics_port)),
            *("--worker-startup-check-interval", "1"),
        ]
        for node in nodes if policy == "kv_aware" else ():  # vllm-router refuses them under another policy
            args += ["--kv-event-source", f"{node.url}=tcp://{HOST}:{node.kv_port}"]
            args += ["--kv-event-replay-source", f"{node.url}=tcp://{HOST}:{node.replay_port}"]
        containers.start("router", image, args, options=("--read-only",))

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError):
            return 0

    def ready(self) -> bool:
        return self.status("/readiness") == 200

    def metric(self, name: str) -> dict[str, float]:
        """One of the router's counters, by its `worker` (or `result`) label: {label value: value}."""
        with urllib.request.urlopen(f"http://{HOST}:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        pattern = rf'^{name}\{{.*?(?:worker|result)="([^"]+)".*\}} (\S+)$'
        return {label: float(value) for label, value in re.findall(pattern, text, re.M)}

    def processed(self) -> dict[str, float]:
        """Requests the router sent to each node, by the node's URL."""
        sent = self.metric("vllm_router_processed_requests_total")
        return {node.url: sent.get(node.url, 0.0) for node in self.nodes}

    def log(self) -> str:
        return self.containers.storage.podman("logs", self.containers.ids["router"])


def complete(url: str, route: str, body: dict[str, Any]) -> str:
    """The text a greedy request generates: the whole answer, or the stream's deltas joined."""
    data = json.dumps({"model": MODEL, "temperature": 0, **body}).encode()
    request = urllib.request.Request(f"{url}{route}", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read().decode()
    chat = route.endswith("/chat/completions")
    if not body.get("stream"):
        choice = json.loads(raw)["choices"][0]
        return str(choice["message"]["content"] if chat else choice["text"])
    chunks = [line[len("data: ") :] for line in raw.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]", raw[-500:]
    choices = [json.loads(chunk)["choices"] for chunk in chunks[:-1]]
    return "".join(str((c[0]["delta"].get("content") or "") if chat else c[0]["text"]) for c in choices if c)
