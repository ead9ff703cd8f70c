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


def parse_exposition(text: str) -> list[Metric]:
    """The families of a text exposition; ``ValueError`` when it is not one."""
    return list(text_string_to_metric_families(text))


class ExpositionSum:
    """Expositions summed sample by sample as they are added; families keep the order in which they first
    appear."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}
        self._values: dict[str, dict[_SampleKey, float]] = {}

    def add(self, families: Iterable[Metric]) -> None:
        """Add one exposition's families; ``ValueError``, and nothing added, when a family has another type
        here than in an exposition added before (or twice in this one)."""
        families = list(families)
        types = {name: family.type for name, family in self._families.items()}
        for family in families:
            known = types.setdefault(family.name, family.type)
            if known != family.type:
                raise ValueError(f"{family.name} is a {family.type} here and a {known} there")
        for family in families:
            if family.name not in self._families:
                self._families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
                self._values[family.name] = {}
            sums = self._values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                sums[key] = sums.get(key, 0.0) + sample.value

    def render(self) -> bytes:
        """The text exposition of the sums."""
        families = []
        for name, template in self._families.items():
            family = Metric(name, template.documentation, template.type, template.unit)
            for (sample_name, labels), value in self._values[name].items():
                family.add_sample(sample_name, dict(labels), value)
            families.append(family)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(families))
        return generate_latest(registry)


def sum_expositions(texts: Iterable[str]) -> bytes:
    """One text exposition whose every sample is the sum of that sample over ``texts``. ``ValueError`` when
    a text is not an exposition, or two give a family different types."""
    total = ExpositionSum()
    for text in texts:
        total.add(parse_exposition(text))
    return total.render()
