"""deploy/'s fleet layout (docker-compose.fleet.yml) run with podman: two nodes, each the CPU image running
openinfer-serve with the built-in model and its DFlash drafter, and deploy/Dockerfile.router's vllm-router
in front of them, with the fleet file's arguments (KV event sources and replay sources, block size, model)
and a read-only root filesystem, as the Kubernetes manifests run it.

Completions and chat, streamed and not, sent through the router give the same greedy text as the same
requests sent to a node directly; each node's /metrics spec-decode counters equal its spec log. Under
round_robin both nodes serve, and each node's count of requests is the router's for it (plus the direct
ones). Under kv_aware, fed by the nodes' KV events, a prompt goes to the node whose prefix cache holds it.
The images are tests/deploy/built_images.py's, cached by a hash of their inputs.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml

from openinfer.engine_core.launch.local_cluster import free_port
from openinfer.tools.spec_tally import AcceptanceTally, read_spec_logs, tally_metrics
from tests.deploy.built_images import cpu_image, router_image
from tests.deploy.compose_files import FLEET_FILE
from tests.deploy.containers import Containers
from tests.deploy.fleet import FleetNode, RouterContainer, complete, ports
from tests.deploy.images import Storage, base_image, reachable, require_image_tools
from tests.deploy.stack import wait_until

pytestmark = pytest.mark.timeout(900)  # a first run bootstraps the base and builds the images

KS = (7, 5)  # K of each node's DFlash drafter
PROMPTS = ("To be, or not to be, that is the question.", "The sea was calm, and the ship sailed on.")
REQUESTS = [
    (route, {**body, "max_tokens": 24, **stream})
    for prompt in PROMPTS
    for route, body in (
        ("/v1/completions", {"prompt": prompt}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}),
    )
    for stream in ({}, {"stream": True})
]


@dataclass
class FleetImages:
    storage: Storage
    cpu: str
    router: str


@dataclass
class Fleet:
    policy: str
    nodes: list[FleetNode]
    router: RouterContainer
    containers: Containers
    routed: list[str] = field(default_factory=list)  # REQUESTS' texts through the router
    direct: list[str] = field(default_factory=list)  # and from node 0 directly
    processed: dict[str, float] = field(default_factory=dict)  # the router's requests per node, after both
    served: dict[str, float] = field(default_factory=dict)  # each node's finished requests, after both


@pytest.fixture(scope="module")
def images() -> Iterator[FleetImages]:
    require_image_tools()
    if not reachable("https://pypi.org/simple/pip/"):
        pytest.skip("PyPI is unreachable: the images' `pip install` steps cannot run here")
    storage = Storage()
    try:
        base = base_image(storage)
        yield FleetImages(storage, cpu_image(storage, base), router_image(storage, base))
    finally:
        storage.unmount()


@pytest.fixture(scope="module", params=["round_robin", "kv_aware"])
def fleet(
    request: pytest.FixtureRequest, images: FleetImages, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Both nodes healthy, then the router ready (it waits for healthy workers before it listens), then
    REQUESTS through the router and to node 0 directly, one at a time."""
    policy = request.param
    work = tmp_path_factory.mktemp(f"fleet-{policy}")
    containers = Containers(images.storage, work)
    try:
        single, engine = ports(3 * len(KS) + 2, len(KS))
        nodes = [
            FleetNode(
                containers, images.cpu, work / f"node-{i}", i, k, [*single[3 * i : 3 * i + 3], engine[i]]
            )
            for i, k in enumerate(KS)
        ]
        for node in nodes:
            wait_until(node.healthy, 180, f"{node.name} healthy", containers)
        router = RouterContainer(containers, images.router, nodes, policy, single[-2:])
        wait_until(router.ready, 60, "the router ready", containers)
        live = Fleet(policy, nodes, router, containers)
        live.routed = [complete(router.url, route, body) for route, body in REQUESTS]
        live.direct = [complete(nodes[0].url, route, body) for route, body in REQUESTS]
        live.processed = router.processed()
        live.served = {node.url: node.requests_served() for node in nodes}
        yield live
    finally:
        containers.stop()


def test_router_answers_as_a_node_does(fleet: Fleet) -> None:
    """Every completion and chat answer, streamed or not, through the router is the greedy text node 0 gives."""
    assert all(fleet.routed) and fleet.routed == fleet.direct


def test_round_robin_uses_both_nodes(fleet: Fleet) -> None:
    """Under round_robin the router sends requests to both nodes, and each node finished exactly the requests
    the router counts for it (node 0 also the direct ones)."""
    if fleet.policy != "round_robin":
        pytest.skip("round_robin only: other policies may send every request to one node")
    nodes = fleet.nodes
    assert sum(fleet.processed.values()) == len(REQUESTS)
    assert all(fleet.processed[node.url] >= 1 for node in nodes), fleet.processed
    assert fleet.served[nodes[0].url] == fleet.processed[nodes[0].url] + len(REQUESTS)
    assert fleet.served[nodes[1].url] == fleet.processed[nodes[1].url]


def test_node_metrics_equal_spec_logs(fleet: Fleet) -> None:
    """The /metrics spec-decode counters of each node that served requests (both under round_robin; under
    kv_aware every request may go to one) equal its engine's spec log, bin by bin, and it drafted."""

    def equal(node: FleetNode) -> bool:
        logs = read_spec_logs([node.spec_log])
        assert not logs.malformed, logs.malformed
        tally = logs.engines.get(0, AcceptanceTally())
        return tally.num_drafts > 0 and tally_metrics(node.metrics())[0].bins() == tally.bins()

    serving = [node for node in fleet.nodes if fleet.served[node.url] > 0]
    assert (
        serving == (fleet.nodes if fleet.policy == "round_robin" else serving) and fleet.nodes[0] in serving
    )
    for node in serving:
        wait_until(
            lambda n=node: equal(n), 15, f"{node.name}'s /metrics to equal its spec log", fleet.containers
        )


def test_router_probes_answer(fleet: Fleet) -> None:
    """The router's /liveness and /readiness (deploy/kubernetes/'s probes) and /health answer 200."""
    assert {path: fleet.router.status(path) for path in ("/liveness", "/readiness", "/health")} == {
        "/liveness": 200,
        "/readiness": 200,
        "/health": 200,
    }


def test_kv_aware_routes_to_the_node_holding_the_prefix(fleet: Fleet) -> None:
    """Under kv_aware, a long prompt first sent to node i directly (so that only node i caches it, and says so
    in its KV events) then goes through the router to node i, for i = 0 and 1: no fixed tie-break does both."""
    if fleet.policy != "kv_aware":
        pytest.skip("kv_aware only")
    prompts = [
        " ".join(f"{word}{n}" for n in range(60)) for word in ("harbour lantern", "orchard ledger")
    ]  # long enough for many full 16-token blocks
    body = {"max_tokens": 4}
    for node, prompt in zip(fleet.nodes, prompts, strict=True):
        complete(node.url, "/v1/completions", {**body, "prompt": prompt})
    time.sleep(2)  # the events of those steps reach the router's subscribers (no signal to wait on)
    went = []
    for prompt in prompts:
        before = [node.requests_served() for node in fleet.nodes]
        complete(fleet.router.url, "/v1/completions", {**body, "prompt": prompt})
        after = [node.requests_served() for node in fleet.nodes]
        went.append([node.name for node, b, a in zip(fleet.nodes, before, after, strict=True) if a > b])
    assert went == [[node.name] for node in fleet.nodes], f"{went}\n{fleet.router.log()[-3000:]}"


def test_fleet_file_healthchecks_on_the_live_containers(fleet: Fleet) -> None:
    """docker-compose.fleet.yml's healthchecks pass against a live node and the live router (their port
    replaced by the container's) and fail where nothing listens."""
    services = yaml.safe_load(FLEET_FILE.read_text())["services"]

    def run(service: str, replace: tuple[str, str]) -> int:
        test = services[service]["healthcheck"]["test"]
        assert test[0] == "CMD"
        argv = [arg.replace(*replace) for arg in test[1:]]
        return subprocess.run(argv, timeout=30, capture_output=True).returncode

    for name in ("node-0", "cpu-node-1"):
        assert run(name, ("http://127.0.0.1:8000", fleet.nodes[0].url)) == 0, name
    assert run("router", ("http://127.0.0.1:30000", fleet.router.url)) == 0
    assert run("router", ("http://127.0.0.1:30000", f"http://127.0.0.1:{free_port()}")) != 0
