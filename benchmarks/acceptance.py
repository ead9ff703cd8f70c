"""Speculative-decoding acceptance of one run: ``/metrics`` scraped before and after, the deltas as the seed's
table (summed over engines and per engine), and the check against the engines' spec logs. The same scrapes
hold the prefix-cache counters (``prefix_cache.py``).

Counters reach ``/metrics`` a little after the tokens (openinfer engines send them at least once a second),
so each side of the run is a *settled* scrape: scraped again after ``SETTLE_INTERVAL_S`` until two agree.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from openinfer.benchmarks.prefix_cache import PrefixCacheCounts, prefix_cache_counts
from openinfer.tools.spec_tally import (
    AcceptanceTally,
    SpecLogTally,
    read_spec_logs,
    scrape_metrics,
    tally_metrics,
    total,
)
from openinfer.tools.verify_log import ALL, Difference, acceptance_rows, compare

# Longer than an engine's heartbeat (1 s): a draft not yet on /metrics at one scrape is there at the next, so
# two equal scrapes this far apart hold every draft made before the first of them.
SETTLE_INTERVAL_S = 1.2
SETTLE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class MetricsSnapshot:
    """The spec-decode and prefix-cache counters per engine of a settled scrape, and when its first agreeing
    scrape ran."""

    engines: dict[int, AcceptanceTally]
    has_histogram: bool  # openinfer:spec_decode_accepted_length_total is exported (vLLM has none)
    started: float  # unix seconds, just before the first of the two agreeing scrapes
    finished: float  # unix seconds, just after it
    settled: bool  # False: the counters still moved at SETTLE_TIMEOUT_S (other traffic)
    prefix_cache: dict[str, PrefixCacheCounts] = field(default_factory=dict)  # by engine label; {}: none


def scrape_settled(metrics_url: str, timeout: float = SETTLE_TIMEOUT_S) -> MetricsSnapshot:
    """Scrape every ``SETTLE_INTERVAL_S`` until two scrapes agree (or ``timeout`` passes).

    Raises ``OSError`` when ``/metrics`` cannot be fetched and ``ValueError`` when it does not parse.
    """
    deadline = time.monotonic() + timeout
    started = time.time()
    counters = _counters(scrape_metrics(metrics_url))
    finished = time.time()
    while True:
        time.sleep(SETTLE_INTERVAL_S)
        next_started = time.time()
        next_counters = _counters(scrape_metrics(metrics_url))
        settled = next_counters == counters
        if settled or time.monotonic() > deadline:
            engines, prefix_cache = counters
            has_histogram = any(tally.hist for tally in engines.values())
            return MetricsSnapshot(engines, has_histogram, started, finished, settled, prefix_cache)
        started, counters, finished = next_started, next_counters, time.time()


def _counters(text: str) -> tuple[dict[int, AcceptanceTally], dict[str, PrefixCacheCounts]]:
    return tally_metrics(text), prefix_cache_counts(text)


@dataclass(frozen=True)
class AcceptanceReport:
    """The counters' deltas between two settled scrapes, per engine index."""

    before: MetricsSnapshot
    after: MetricsSnapshot

    @property
    def engines(self) -> dict[int, AcceptanceTally]:
        return {
            index: tally.minus(self.before.engines.get(index, AcceptanceTally()))
            for index, tally in sorted(self.after.engines.items())
        }

    @property
    def total(self) -> AcceptanceTally:
        return total(self.engines.values())

    @property
    def window(self) -> tuple[float, float]:
        """Unix times the deltas cover: drafts timed within it are the run's."""
        return self.before.started, self.after.finished

    def format(self) -> str:
        """The seed's table: a row per figure, a column summed over engines and one per engine."""
        if not self.after.engines:
            return "no speculative-decoding counters on /metrics (is a drafter configured?)"
        engines = self.engines
        columns = [("all engines", self.total)] + [(f"engine {i}", t) for i, t in engines.items()]
        tallies = [tally for _, tally in columns]
        k = max(t.num_spec_tokens for t in tallies)
        num_pos = max(len(t.per_pos) for t in tallies)
        num_hist = max(len(t.hist) for t in tallies) if self.after.has_histogram else None
        rows = [acceptance_rows(t, k=k, num_pos=num_pos, num_hist=num_hist) for t in tallies]
        table = [["", *(name for name, _ in columns)]]
        table += [[label, *(column[i][1] for column in rows)] for i, (label, _) in enumerate(rows[0])]
        widths = [max(len(row[c]) for row in table) + 2 for c in range(len(columns) + 1)]
        lines = ["".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in table]
        if not (self.before.settled and self.after.settled):
            lines.append("warning: the counters kept moving while scraped: other traffic may be counted")
        return "\n".join(line.rstrip() for line in lines)

    def to_json(self) -> dict[str, object]:
        tally = self.total
        return {
            "window": list(self.window),
            "settled": self.before.settled and self.after.settled,
            "has_histogram": self.after.has_histogram,
            "mean_accepted": _finite(tally.mean_accepted),
            "mean_acceptance_length": _finite(tally.mean_acceptance_length),
            "acceptance_rate": _finite(tally.acceptance_rate),
            "zero_accept_rate": _finite(tally.zero_accept_rate) if self.after.has_histogram else None,
            "full_accept_rate": _finite(tally.full_accept_rate) if self.after.has_histogram else None,
            "per_pos_rates": [_finite(rate) for rate in tally.per_pos_rates()],
            ALL: tally.to_json(),
            "engines": {str(i): t.to_json() for i, t in self.engines.items()},
        }


@dataclass(frozen=True)
class SpecLogCheck:
    """The engines' spec-log lines timed within the run, against the run's ``/metrics`` deltas."""

    directory: Path
    files: list[Path]
    logs: SpecLogTally
    differences: list[Difference]

    @property
    def agree(self) -> bool:
        return not self.differences and not self.logs.malformed

    def format(self) -> str:
        drafts = total(self.logs.engines.values()).num_drafts
        where = f"spec logs ({len(self.files)} file(s) in {self.directory}, {drafts} drafts within the run)"
        if self.agree:
            return f"{where}: agree with the /metrics deltas bin by bin"
        lines = [f"{where}: DISAGREE with the /metrics deltas"]
        lines += [f"  not a draft: {line}" for line in self.logs.malformed]
        lines += [f"  differs: {d.describe()}" for d in self.differences]
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "directory": str(self.directory),
            "agree": self.agree,
            "differences": [d.describe() for d in self.differences],
            "malformed_lines": self.logs.malformed,
            "engines": {str(i): t.to_json() for i, t in sorted(self.logs.engines.items())},
        }


def check_spec_logs(report: AcceptanceReport, directory: Path) -> SpecLogCheck:
    """Tally ``directory/*.jsonl`` over the run's window and compare bin by bin, per engine and summed.

    Raises ``ValueError`` when ``directory`` is not a folder and ``OSError`` when a log cannot be read. A
    folder without logs tallies nothing: it disagrees with any draft on /metrics, and the report says so.
    """
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a folder: give the one the engines' --spec-log files are in")
    files = sorted(directory.glob("*.jsonl"))
    since, until = report.window
    logs = read_spec_logs(files, since=since, until=until)
    return SpecLogCheck(directory, files, logs, compare(report.engines, logs.engines))


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value
