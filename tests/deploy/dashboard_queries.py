"""The Grafana dashboard's queries and the recording rules' names, read from deploy/, and the metric names a
PromQL expression selects: what the dashboard and live Prometheus tests check."""

from __future__ import annotations

import json
import re

import yaml

from tests.deploy.stack import DEPLOY, PROMETHEUS_DIR

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "openinfer-spec-decode.json"
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool"}
_KEYWORDS |= {"offset", "inf", "nan"}


def dashboard_exprs() -> list[str]:
    """Every query of the dashboard's panels, with the model variable set to "all models"."""
    exprs: list[str] = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            exprs.extend(target["expr"].replace("$model", ".+") for target in panel.get("targets", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return exprs


def rule_groups() -> list[dict]:
    """Every rule group of deploy/prometheus/rules."""
    return [
        group
        for rules_file in sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
        for group in yaml.safe_load(rules_file.read_text())["groups"]
    ]


def recorded_names() -> set[str]:
    """The series names the recording rules produce."""
    return {rule["record"] for group in rule_groups() for rule in group["rules"] if "record" in rule}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, keywords, labels or numbers)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[a-zA-Z_:][\w:]*", expr):
        if not expr[match.end() :].lstrip().startswith("(") and match.group().lower() not in _KEYWORDS:
            names.add(match.group())  # not a function or aggregation, not a keyword
    return names
