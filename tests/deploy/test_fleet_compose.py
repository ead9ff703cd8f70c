"""deploy/docker-compose.fleet.yml: Debian's docker-compose validates and resolves it with deploy/fleet.env (no
Docker engine needed) for the GPU default and the CPU profile, and its commands parse with openinfer-serve's
and vllm-router's own parsers, the router naming exactly the nodes, their ports and their KV event sockets."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy.compose_files import FLEET_ENV_FILE, active, argv, env_file, flag, fleet_config, port_pair
from tests.deploy.fleet_args import Node, check_router_names_nodes, parse_node, parse_router
from tests.deploy.stack import PROMETHEUS_DIR

ALWAYS = {"router", "prometheus", "grafana"}


def nodes(services: dict[str, Any]) -> dict[str, Node]:
    """The nodes by the name the router reaches them at (a GPU node's service name, a CPU node's alias)."""
    found = {}
    for name, service in services.items():
        if "node" in name:
            (alias,) = service.get("networks", {}).get("default", {}).get("aliases") or [name]
            found[alias] = parse_node(argv(service))
    return dict(sorted(found.items()))


def test_gpu_default() -> None:
    """With deploy/fleet.env as shipped (COMPOSE_PROFILES=gpu): node-0 and node-1, each openinfer-serve with one
    engine on its own reserved GPU, the models read-only and a state volume of its own; the router,
    Prometheus and Grafana."""
    assert env_file(FLEET_ENV_FILE)["COMPOSE_PROFILES"] == "gpu"
    services = active(fleet_config(), {"gpu"})
    assert set(services) == ALWAYS | {"node-0", "node-1"}
    volumes = set()
    for index in (0, 1):
        node = services[f"node-{index}"]
        assert argv(node)[:5] == ["openinfer-serve", "--device", "cuda", "--engines", "1"]
        assert node["build"]["dockerfile"] == "deploy/Dockerfile"
        (device,) = node["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["device_ids"] == [str(index)]
        models = {
            f"{env_file(FLEET_ENV_FILE)[v]}:/models/{d}:ro"
            for v, d in [("MODEL_DIR", "target"), ("DRAFT_MODEL_DIR", "draft")]
        }
        assert models <= set(node["volumes"])
        (state,) = set(node["volumes"]) - models
        assert state.split(":")[1] == flag(node, "--state-dir") == "/state"
        volumes.add(state.split(":")[0])
        assert flag(node, "--model") == "/models/target"
        assert flag(node, "--served-model-name") == env_file(FLEET_ENV_FILE)["SERVED_MODEL_NAME"]
    assert volumes == {"node-0-state", "node-1-state"}  # one state folder per node


@pytest.mark.parametrize("how", ["env", "flag"])
def test_cpu_profile(how: str) -> None:
    """COMPOSE_PROFILES=cpu (or --profile cpu): the same two nodes on the CPU image with the built-in model,
    reachable under the GPU nodes' names."""
    config = fleet_config(COMPOSE_PROFILES="cpu") if how == "env" else fleet_config("--profile", "cpu")
    services = active(config, {"cpu"})
    assert set(services) == ALWAYS | {"cpu-node-0", "cpu-node-1"}
    for index in (0, 1):
        node = services[f"cpu-node-{index}"]
        assert node["networks"]["default"]["aliases"] == [f"node-{index}"]
        assert argv(node)[:5] == ["openinfer-serve", "--device", "cpu", "--engines", "1"]
        assert node["build"]["dockerfile"] == "deploy/Dockerfile.cpu"
        assert "--model" not in argv(node) and "deploy" not in node
        assert node["volumes"] == [f"node-{index}-state:/state:rw"]


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_commands_parse_with_the_real_clis(profile: str) -> None:
    """Every node's command parses with openinfer-serve's parser and the router's with vllm-router's; the
    router's workers, KV event sockets and replay sockets are exactly the nodes', its block size theirs."""
    services = active(fleet_config(COMPOSE_PROFILES=profile), {profile})
    found = nodes(services)
    assert list(found) == ["node-0", "node-1"]
    for node in found.values():
        assert (node.args.host, node.args.port, str(node.args.state_dir)) == ("0.0.0.0", 8000, "/state")
    router = parse_router(services["router"]["command"])
    check_router_names_nodes(router, found)
    assert router.policy == "kv_aware" and (router.host, router.port) == ("0.0.0.0", 30000)
    assert services["router"]["build"]["dockerfile"] == "deploy/Dockerfile.router"


def test_block_size_is_one_variable() -> None:
    """KV_BLOCK_SIZE sets the nodes' block size and the router's together."""
    services = active(fleet_config(KV_BLOCK_SIZE="32"), {"gpu"})
    router = parse_router(services["router"]["command"])
    check_router_names_nodes(router, nodes(services))
    assert router.kv_event_block_size == 32


def test_ports_healthchecks_and_restarts() -> None:
    """Only the router is published; every service has a healthcheck on its own port and a restart policy."""
    services = active(fleet_config(), {"gpu"})
    router = services["router"]
    assert {port_pair(p) for p in router["ports"]} == {(30000, 30000)}
    assert "/liveness" in router["healthcheck"]["test"][-1] and ":30000/" in router["healthcheck"]["test"][-1]
    for name, service in services.items():
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["test"][0] == "CMD", name
        if name.startswith("node-"):
            assert "ports" not in service  # reached through the router only
            assert f":{flag(service, '--port')}/health" in service["healthcheck"]["test"][-1]


def test_prometheus_scrapes_every_node_and_the_router() -> None:
    """prometheus/fleet.yml scrapes each node at its HTTP port with a `node` label of its name (as the job the
    alerts read), and the router at its --prometheus-port."""
    services = active(fleet_config(), {"gpu"})
    assert "./prometheus/fleet.yml:/etc/prometheus/prometheus.yml:ro" in [
        v.replace(str(PROMETHEUS_DIR), "./prometheus") for v in services["prometheus"]["volumes"]
    ]
    config = yaml.safe_load((PROMETHEUS_DIR / "fleet.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    found = nodes(services)
    assert jobs["openinfer-frontend"]["static_configs"] == [
        {"targets": [f"{host}:{node.args.port}"], "labels": {"node": host}} for host, node in found.items()
    ]
    router = parse_router(services["router"]["command"])
    assert router.prometheus_host == "0.0.0.0"
    assert jobs["vllm-router"]["static_configs"] == [{"targets": [f"router:{router.prometheus_port}"]}]
