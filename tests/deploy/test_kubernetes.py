"""deploy/kubernetes/: every manifest validated offline against Kubernetes' own schemas (PyPI's
kubernetes-validate, --strict: no field Kubernetes does not know), and the wiring checked across manifests:
the router names exactly the StatefulSet's pods, their HTTP port and KV event sockets; probes hit /health on
the serving port; each node asks for a GPU; Prometheus finds the metrics ports."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.fleet_args import check_router_names_nodes, parse_node, parse_router
from tests.deploy.stack import DEPLOY

KUBERNETES_DIR = DEPLOY / "kubernetes"
MANIFESTS = sorted(p for p in KUBERNETES_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")
# The oldest Kubernetes the manifests are written for (every field GA there), and the newest schema bundled.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
# Custom resources, for which Kubernetes has no schema: checked by the tests below instead.
CUSTOM = {"prometheus-operator/podmonitors.yaml"}


def documents(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((KUBERNETES_DIR / name).read_text()) if doc]


def one(name: str) -> dict[str, Any]:
    (doc,) = documents(name)
    return doc


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (found,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(found)


def port(c: dict[str, Any], name: str) -> int:
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == name]
    return int(number)


def test_every_file_is_checked() -> None:
    """The manifests are the four the kustomization applies and the optional PodMonitors; no other file."""
    names = [str(p.relative_to(KUBERNETES_DIR)) for p in MANIFESTS]
    assert names == [
        "node-service.yaml",
        "node-statefulset.yaml",
        "prometheus-operator/podmonitors.yaml",
        "router-deployment.yaml",
        "router-service.yaml",
    ]
    assert {p.name for p in KUBERNETES_DIR.rglob("*") if p.is_file()} == {
        *(p.name for p in MANIFESTS),
        "kustomization.yaml",
    }
    kustomization = one("kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(set(names) - CUSTOM)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_validate_strict(version: str) -> None:
    """`kubernetes-validate --strict` passes every manifest; only the custom resources lack a schema."""
    tool = shutil.which("kubernetes-validate")
    if tool is None:
        pytest.skip("kubernetes-validate not installed: `pip install -e '.[test]'` installs it")
    result = subprocess.run(
        [tool, "--strict", "--kubernetes-version", version, *map(str, MANIFESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=KUBERNETES_DIR,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    passed = {line.split()[1] for line in out.splitlines() if line.startswith("INFO") and " passed " in line}
    assert passed == {str(p) for p in MANIFESTS if str(p.relative_to(KUBERNETES_DIR)) not in CUSTOM}, out
    unknown = {line.split()[1] for line in out.splitlines() if "Couldn't find schema" in line}
    assert unknown == {str(KUBERNETES_DIR / name) for name in CUSTOM}, out


def test_router_names_exactly_the_statefulset_pods() -> None:
    """The router's --worker-urls, --kv-event-source and --kv-event-replay-source are the StatefulSet's pods
    by their stable DNS names (pod.headless-service), at the container's HTTP and KV event ports, one per
    replica, and both parse with vllm-router's and openinfer-serve's own parsers."""
    statefulset, service = one("node-statefulset.yaml"), one("node-service.yaml")
    node_container = container(statefulset)
    node = parse_node([*node_container["command"], *node_container["args"]])
    assert node.args.port == port(node_container, "http")
    assert node.kv_endpoint("h") == f"tcp://h:{port(node_container, 'kv-events')}"
    assert node.kv_endpoint("h", "replay_endpoint") == f"tcp://h:{port(node_container, 'kv-replay')}"
    # The pods' DNS names come from the headless Service the StatefulSet names.
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == pod_labels == statefulset["spec"]["selector"]["matchLabels"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {p["name"] for p in node_container["ports"]}
    name, replicas = statefulset["metadata"]["name"], statefulset["spec"]["replicas"]
    pods = {f"{name}-{i}.{service['metadata']['name']}": node for i in range(replicas)}
    router = parse_router(container(one("router-deployment.yaml"))["args"])
    check_router_names_nodes(router, pods)
    assert router.policy == "kv_aware"


def test_probes_hit_health_on_the_serving_port() -> None:
    """A node's startup, readiness and liveness probes GET /health on the port openinfer-serve serves; the
    router's its own /liveness and /readiness on its --port; the router waits for the nodes as long as its
    startup probe lets it."""
    node = container(one("node-statefulset.yaml"))
    serving = parse_node([*node["command"], *node["args"]]).args.port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert node[probe]["httpGet"]["path"] == "/health", probe
        assert port(node, node[probe]["httpGet"]["port"]) == serving, probe
    router = container(one("router-deployment.yaml"))
    args = parse_router(router["args"])
    paths = {
        probe: router[probe]["httpGet"]["path"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe")
    }
    assert paths == {
        "startupProbe": "/liveness",
        "readinessProbe": "/readiness",
        "livenessProbe": "/liveness",
    }
    assert {port(router, router[p]["httpGet"]["port"]) for p in paths} == {args.port}
    startup = router["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= args.worker_startup_timeout_secs
    service = one("router-service.yaml")
    ((target,),) = [[p["targetPort"] for p in service["spec"]["ports"]]]
    assert port(router, target) == args.port


def test_each_node_gets_a_gpu_and_a_state_volume() -> None:
    """Each node requests one nvidia.com/gpu with the CUDA engine image and --device cuda, and keeps
    --state-dir on a volume claim of its own (volumeClaimTemplates)."""
    statefulset = one("node-statefulset.yaml")
    node = container(statefulset)
    assert (
        node["resources"]["requests"]["nvidia.com/gpu"] == node["resources"]["limits"]["nvidia.com/gpu"] == 1
    )
    assert node["image"].split(":")[0] == "openinfer-engine"  # deploy/Dockerfile, as compose names it
    args = parse_node([*node["command"], *node["args"]]).args
    assert args.device == "cuda" and args.engines == 1
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in node["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == str(args.state_dir)
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001  # the images' user
    assert (args.model, args.draft_model) == ("/models/target", "/models/draft")
    assert mounts["models"] == "/models"


def test_prometheus_finds_the_metrics_ports() -> None:
    """The pods' prometheus.io annotations name the port that serves /metrics (a node's HTTP port, the
    router's --prometheus-port on 0.0.0.0); the PodMonitors select the same pods and ports by name, the
    nodes as the job the alerts read, with a `node` label of the pod's name."""
    statefulset, deployment = one("node-statefulset.yaml"), one("router-deployment.yaml")
    router_args = parse_router(container(deployment)["args"])
    assert router_args.prometheus_host == "0.0.0.0"
    expected = {"node": ("http", 8000), "router": ("metrics", router_args.prometheus_port)}
    monitors = {m["metadata"]["name"]: m for m in documents("prometheus-operator/podmonitors.yaml")}
    for workload in (statefulset, deployment):
        template = workload["spec"]["template"]
        component = template["metadata"]["labels"]["app.kubernetes.io/component"]
        port_name, number = expected[component]
        annotations = template["metadata"]["annotations"]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(number),
            "prometheus.io/path": "/metrics",
        }
        assert port(container(workload), port_name) == number
        monitor = monitors[f"openinfer-{component}"]
        assert monitor["kind"] == "PodMonitor" and monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["spec"]["selector"]["matchLabels"] == template["metadata"]["labels"]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"]) == (port_name, "/metrics")
        job = {r["targetLabel"]: r.get("replacement") for r in endpoint["relabelings"]}["job"]
        assert job == {"node": "openinfer-frontend", "router": "vllm-router"}[component]
    (endpoint,) = monitors["openinfer-node"]["spec"]["podMetricsEndpoints"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "node"} in endpoint["relabelings"]


def test_files_are_not_machine_specific() -> None:
    """No manifest names a namespace (kubectl -n or the kustomization picks it) or a path of this machine."""
    for path in MANIFESTS:
        for doc in documents(str(path.relative_to(KUBERNETES_DIR))):
            assert "namespace" not in doc["metadata"], path
        assert str(Path.home()) not in path.read_text()
