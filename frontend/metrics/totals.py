"""Every counter and histogram total the frontend exports, held as plain numbers it can save and restore.

prometheus_client's own Counter and Histogram keep their values private, so a frontend restarted with
``--state-dir`` could not continue their series exactly. Here each family is a dict from label values to
totals; :class:`MetricTotals` is the collector that exposes them (``NAME_total`` for counters; ``_bucket``,
``_count``, ``_sum`` for histograms, as prometheus_client would) and turns them into a
:class:`TotalsState` and back. Everything runs on the frontend's event loop: no locks.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterator, Sequence

import msgspec
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

logger = logging.getLogger(__name__)

Labels = tuple[str, ...]


class CounterSeries(msgspec.Struct, array_like=True):
    """One counter series as saved: its label values (in the family's label order) and its total."""

    labels: list[str]
    value: float


class HistogramSeries(msgspec.Struct, array_like=True):
    """One histogram series as saved: observations per bucket (not cumulative; +Inf last) and their sum."""

    labels: list[str]
    bucket_counts: list[int]
    sum: float


class TotalsState(msgspec.Struct):
    """Every family's series by family name (the name as declared, without ``_total``)."""

    counters: dict[str, list[CounterSeries]] = {}
    histograms: dict[str, list[HistogramSeries]] = {}


class CounterFamily:
    """A counter family: a monotonic total per label-value tuple."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        """Add ``amount`` (>= 0) to the series ``labels``; 0 creates the series at 0."""
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up, got an increment of {amount}")
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {labels}")
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def get(self, labels: Labels) -> float:
        return self.values.get(labels, 0.0)

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in self.values.items():
            family.add_metric(list(labels), value)
        return family


class _Histogram:
    """One histogram series: observations per bucket (+Inf last) and their sum."""

    __slots__ = ("bucket_counts", "sum")

    def __init__(self, num_buckets: int) -> None:
        self.bucket_counts = [0] * num_buckets
        self.sum = 0.0


class HistogramFamily:
    """A histogram family with fixed bucket upper bounds (+Inf is added)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        if list(buckets) != sorted(buckets) or not buckets:
            raise ValueError(f"{name}: buckets must be given in increasing order")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.upper_bounds = (*buckets, math.inf) if buckets[-1] != math.inf else tuple(buckets)
        self.values: dict[Labels, _Histogram] = {}

    def observe(self, labels: Labels, value: float) -> None:
        series = self.values.get(labels)
        if series is None:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {labels}")
            series = self.values[labels] = _Histogram(len(self.upper_bounds))
        series.bucket_counts[bisect.bisect_left(self.upper_bounds, value)] += 1  # le: value <= bound
        series.sum += value

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in self.values.items():
            cumulative, buckets = 0, []
            for bound, count in zip(self.upper_bounds, series.bucket_counts, strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), float(cumulative)))
            family.add_metric(list(labels), buckets, series.sum)
        return family


class MetricTotals(Collector):
    """The collector of every counter and histogram family declared through it."""

    def __init__(self) -> None:
        self._counters: dict[str, CounterFamily] = {}
        self._histograms: dict[str, HistogramFamily] = {}

    def counter(self, name: str, documentation: str, labelnames: Sequence[str]) -> CounterFamily:
        """Declare a counter family; ``name`` without ``_total`` (it is exported as ``name_total``)."""
        self._check_new(name)
        family = self._counters[name] = CounterFamily(name, documentation, labelnames)
        return family

    def histogram(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> HistogramFamily:
        self._check_new(name)
        family = self._histograms[name] = HistogramFamily(name, documentation, labelnames, buckets)
        return family

    def drop_zero_series(self, label: str, value: str) -> bool:
        """Remove every series whose ``label`` is ``value`` if none of them ever moved from zero; False,
        and nothing removed, if one did (exported counters never go down, so a moved series stays)."""
        counters = [(f, labels) for f in self._counters.values() for labels in _having(f, label, value)]
        histograms = [(f, labels) for f in self._histograms.values() for labels in _having(f, label, value)]
        if any(f.values[labels] for f, labels in counters) or any(
            any(f.values[labels].bucket_counts) for f, labels in histograms
        ):
            return False
        for counter, labels in counters:
            del counter.values[labels]
        for histogram, labels in histograms:
            del histogram.values[labels]
        return True

    def _check_new(self, name: str) -> None:
        if name in self._counters or name in self._histograms:
            raise ValueError(f"metric family {name!r} is declared twice")

    def collect(self) -> Iterator[Metric]:
        for counter in self._counters.values():
            yield counter.metric()
        for histogram in self._histograms.values():
            yield histogram.metric()

    def state(self) -> TotalsState:
        """Every series' totals now (copies: later increments do not change it)."""
        return TotalsState(
            counters={
                name: [CounterSeries(list(labels), value) for labels, value in family.values.items()]
                for name, family in self._counters.items()
            },
            histograms={
                name: [
                    HistogramSeries(list(labels), list(series.bucket_counts), series.sum)
                    for labels, series in family.values.items()
                ]
                for name, family in self._histograms.items()
            },
        )

    def restore(self, state: TotalsState) -> None:
        """Set every series saved in ``state`` (before anything is counted); families it lacks stay empty.

        A saved family this frontend no longer declares, or a series whose labels or buckets no longer fit
        its family, is skipped with a warning: it cannot continue, so it is not exported.
        """
        gone = (state.counters.keys() - self._counters.keys()) | (
            state.histograms.keys() - self._histograms.keys()
        )
        for name in sorted(gone):
            logger.warning("state: %s is no longer exported; its saved series are dropped", name)
        for name, counter in self._counters.items():
            for c in state.counters.get(name, []):
                if len(c.labels) != len(counter.labelnames) or not c.value >= 0:
                    logger.warning("state: dropped a saved %s series that does not fit: %s", name, c)
                    continue
                counter.values[tuple(c.labels)] = c.value
        for name, histogram in self._histograms.items():
            num_buckets = len(histogram.upper_bounds)
            for h in state.histograms.get(name, []):
                if len(h.labels) != len(histogram.labelnames) or len(h.bucket_counts) != num_buckets:
                    logger.warning("state: dropped a saved %s series that does not fit its buckets", name)
                    continue
                series = histogram.values[tuple(h.labels)] = _Histogram(num_buckets)
                series.bucket_counts, series.sum = list(h.bucket_counts), h.sum


def _having(family: CounterFamily | HistogramFamily, label: str, value: str) -> list[Labels]:
    """The label values of ``family``'s series whose ``label`` is ``value``."""
    if label not in family.labelnames:
        return []
    position = family.labelnames.index(label)
    return [labels for labels in family.values if labels[position] == value]
