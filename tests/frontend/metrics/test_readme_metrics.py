"""The README's table of metrics is what /metrics exports: every family, its type and its labels."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import Gauge

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics

README = Path(__file__).resolve().parents[3] / "README.md"
ROW = re.compile(r"^\| `(?P<name>[a-z0-9_:]+)` \| (?P<kind>counter|gauge|histogram) \| (?P<labels>.*) \|$")


def readme_table() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, labels) from the README's Metrics table (labels: the backticked words before any
    parenthesis in a comma-separated cell)."""
    table = {}
    for line in README.read_text().splitlines():
        if match := ROW.match(line):
            cells = re.sub(r"\(.*?\)", "", match["labels"]).split(",")
            table[match["name"]] = (match["kind"], tuple(cell.strip().strip("`") for cell in cells))
    return table


def exported() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, labels) of every family a frontend registers, before any sample exists (the label
    names are the families' own, read from prometheus_client's and MetricTotals' attributes)."""
    metrics = FrontendMetrics()
    families: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name, counter in metrics.totals._counters.items():
        families[f"{name}_total"] = ("counter", counter.labelnames)
    for name, histogram in metrics.totals._histograms.items():
        families[name] = ("histogram", histogram.labelnames)
    for collector in metrics.registry._collector_to_names:
        if isinstance(collector, Gauge):
            families[collector._name] = ("gauge", collector._labelnames)
    return families


def test_the_readme_lists_every_metric_with_its_labels() -> None:
    table = readme_table()
    assert len(table) > 15, "the README's Metrics table was not found"
    assert table == exported()
