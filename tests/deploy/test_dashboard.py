"""deploy/grafana: provisioning matches docker-compose.yml, and the dashboard's queries are valid PromQL over
series that exist (the live check against a frontend's /metrics is in test_prometheus_live.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.protocol import LoadSnapshot, PrefixCacheCounters, SpecDecodeCounters
from tests.deploy.dashboard_queries import (
    DASHBOARD,
    dashboard_exprs,
    metric_names,
    recorded_names,
    rule_groups,
)
from tests.deploy.stack import DEPLOY, require_tools


def test_metric_names_parser() -> None:
    """The name extraction the dashboard checks rely on."""
    expr = (
        'histogram_quantile(0.99, sum by (model_name, le) (x:y_bucket:rate1m{model_name=~".+"}))'
        " / on (model_name) group_left () (up offset 5m > bool 1e-9) + rate(vllm:a_total[1m])"
    )
    assert metric_names(expr) == {"x:y_bucket:rate1m", "up", "vllm:a_total"}


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses every dashboard query (each checked as a recording rule's expression)."""
    require_tools("promtool")
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"q{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_dashboard_shape() -> None:
    """Panels use the datasource variable, have unique ids and fit the 24-column grid; the model variable
    reads a series every engine exports."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert metric_names(variables["model"]["definition"].removeprefix("label_values")) >= {
        "vllm:num_requests_running"
    }
    titles = " ".join(p["title"] for p in panels).lower()
    for topic in ("acceptance rate", "mean acceptance length", "per-position", "accepted-length", "drafts"):
        assert topic in titles, topic
    for topic in ("conditional acceptance rate", "unverified", "dspark confidence calibration"):
        assert topic in titles, topic
    for topic in ("time to first token", "inter-token", "running and waiting", "kv cache"):
        assert topic in titles, topic
    for topic in ("prefix-cache hit rate", "prefix-cache hit rate per engine", "prefix-cache lookups"):
        assert topic in titles, topic


def test_prefix_cache_rules_and_panels_read_exported_series() -> None:
    """The prefix-cache rules read exactly the counters a frontend exports once an engine reports prefix
    caching, and the prefix-cache panels read only recorded series (which federation carries)."""
    metrics = FrontendMetrics()
    metrics.observe_load(0, 1, "m", LoadSnapshot(0, 1, 0, 0, None, PrefixCacheCounters(16, 0)))
    exported = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)", metrics.render().decode(), re.M)}
    recorded = recorded_names()
    (group,) = [g for g in rule_groups() if g["name"] == "openinfer-prefix-cache"]
    sources = set().union(*(metric_names(rule["expr"]) for rule in group["rules"])) - recorded
    assert sources == {"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"}
    assert sources <= exported
    panels = [p for p in json.loads(DASHBOARD.read_text())["panels"] if "prefix" in p["title"].lower()]
    exprs = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    assert len(exprs) == 5
    for expr in exprs:
        assert metric_names(expr) <= recorded, expr


def test_calibration_panels_plot_confidence_beside_measured_acceptance() -> None:
    """The "DSpark confidence calibration" panels plot, per position, the recorded mean confidence and the
    measured acceptance of the same drafts (fleet: the engines with a confidence head; per engine), and
    those rules read the reached and confidence counters a frontend exports."""
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    fleet = [t["expr"] for t in panels["DSpark confidence calibration"]["targets"]]
    per_engine = [t["expr"] for t in panels["DSpark confidence calibration per engine"]["targets"]]
    assert [metric_names(e) for e in fleet] == [
        {"model_name:spec_decode_mean_confidence:ratio_rate1m"},
        {"model_name:spec_decode_rated_reached_acceptance_rate:ratio_rate1m"},
    ]
    assert [metric_names(e) for e in per_engine] == [
        {"engine:spec_decode_mean_confidence:ratio_rate1m"},
        {"engine:spec_decode_reached_acceptance_rate:ratio_rate1m"},
    ]
    recorded = recorded_names()
    assert all(metric_names(e) <= recorded for e in fleet + per_engine)
    (group,) = [g for g in rule_groups() if g["name"] == "openinfer-spec-decode"]
    sources = set().union(*(metric_names(rule["expr"]) for rule in group["rules"])) - recorded
    assert {
        "openinfer:spec_decode_num_reached_per_pos_total",
        "openinfer:spec_decode_confidence_micros_per_pos_total",
    } <= sources
    metrics = FrontendMetrics()
    metrics.observe_load(0, 1, "m", LoadSnapshot(0, 1, 0, 0, SpecDecodeCounters.zero(2)))
    exported = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)", metrics.render().decode(), re.M)}
    assert sources <= exported


def test_provisioning_matches_compose() -> None:
    """The datasource points at the compose Prometheus; the dashboard provider reads where compose mounts
    deploy/grafana/dashboards."""
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    provisioning = DEPLOY / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "openinfer.yml").read_text())["providers"]
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in grafana["volumes"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
