"""The sum of several frontends' ``/metrics`` expositions: one exposition of the whole server.

With ``openinfer-serve --api-server-count N`` every scrape of the shared port must show every frontend's
request metrics and each engine's counters and gauges once. Each frontend's own exposition holds its own
requests' series and the series of the engines it is the metrics frontend of (only it exports them), so the
whole server is the sample-by-sample sum: a series several frontends export (``vllm:prompt_tokens_total``
of one model and engine, a histogram bucket) is summed, one only its engine's metrics frontend exports is
taken as it is. It is what PromQL's ``sum without (instance)`` gives over frontends scraped apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

_SampleKey = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


class _Families(Collector):
    """Families to expose, as they are."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def sum_expositions(texts: Iterable[str]) -> bytes:
    """One text exposition whose every sample is the sum of that sample over ``texts``; families keep the
    order in which they first appear. ``ValueError`` when a text is not an exposition."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[_SampleKey, float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            elif families[family.name].type != family.type:
                raise ValueError(
                    f"{family.name} is a {family.type} here and a {families[family.name].type} there"
                )
            sums = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                sums[key] = sums.get(key, 0.0) + sample.value
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
