"""The README's table of metrics is what /metrics exports: every family, its type and its labels."""

from __future__ import annotations

import re
from pathlib import Path

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.protocol import LoadSnapshot, PrefixCacheCounters, SpecDecodeCounters

README = Path(__file__).resolve().parents[3] / "README.md"
ROW = re.compile(r"^\| `(?P<name>[a-z0-9_:]+)` \| (?P<kind>counter|gauge|histogram) \| (?P<labels>.*) \|$")
# Labels the exposition adds to a family's own: a histogram's bucket bound.
EXPOSITION_LABELS = {"le"}
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')  # a label's name, before its quoted value


def readme_table() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, sorted labels) from the README's Metrics table (labels: the backticked words before
    any parenthesis in a comma-separated cell)."""
    table = {}
    for line in README.read_text().splitlines():
        if match := ROW.match(line):
            cells = re.sub(r"\(.*?\)", "", match["labels"]).split(",")
            table[match["name"]] = (match["kind"], tuple(sorted(cell.strip().strip("`") for cell in cells)))
    return table


def metrics_with_every_family() -> FrontendMetrics:
    """A frontend whose every family has a sample, moved through its public calls only: an engine that
    joined, then restarted and sent a draft and a prefix-cache lookup, one request served, one bad frame and
    one refused hello."""
    metrics = FrontendMetrics()
    metrics.engine_joined(0, incarnation=1)
    metrics.set_engine_up(0, True)
    metrics.observe_load(
        0, 1, "m", LoadSnapshot(1, 8, 1, 0, SpecDecodeCounters.zero(2), PrefixCacheCounters())
    )
    metrics.engine_joined(0, incarnation=2)  # a restart: counted, and its counters diffed from zero (a reset)
    spec, prefix = SpecDecodeCounters.zero(2), PrefixCacheCounters()
    spec.observe_draft(2, 1)
    prefix.record(16, 8)
    metrics.observe_load(0, 2, "m", LoadSnapshot(1, 8, 1, 0, spec, prefix))
    metrics.observe_first_token("m", 0, num_prompt_tokens=4, time_to_first_token=0.1)
    metrics.observe_output("m", 0, num_tokens=2, inter_token_latency=0.01)
    metrics.observe_finish("m", 0, "length", e2e_latency=0.2)
    metrics.observe_request_params_n("m", 1)
    metrics.count_protocol_error("undecodable")
    metrics.count_hello_refused(0, "engine_alive")
    return metrics


def exported(metrics: FrontendMetrics) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, labels) of every family in the exposition's text: a family's samples follow its TYPE
    line; a counter by its ``_total`` name (its TYPE line may leave the suffix off); labels sorted (the
    exposition sorts them: Prometheus labels have no order), without the exposition's own ``le``."""
    families: dict[str, tuple[str, tuple[str, ...]]] = {}
    name = ""
    for line in metrics.render().decode().splitlines():
        if line.startswith("# TYPE "):
            family, kind = line.removeprefix("# TYPE ").split(" ")
            name = f"{family.removesuffix('_total')}_total" if kind == "counter" else family
            families[name] = (kind, ())
        elif not line.startswith("#"):
            kind, labels = families[name]
            keys = [key for key in LABEL.findall(line) if key not in EXPOSITION_LABELS]
            families[name] = (kind, tuple(sorted({*labels, *keys})))
    return families


def test_the_readme_lists_every_metric_with_its_labels() -> None:
    """Each row of the README's table is a family the frontend exports, with that type and those labels, and
    the frontend exports no family the table leaves out."""
    table = readme_table()
    assert len(table) > 15, "the README's Metrics table was not found"
    assert table == exported(metrics_with_every_family())
