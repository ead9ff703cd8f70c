"""Throughput and latency of one load run, from its requests' outcomes, printed as ``vllm bench serve`` does."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from openinfer.benchmarks.request_client import RequestOutcome

MAX_ERRORS_SHOWN = 10  # distinct error messages printed; the JSON has them all
RULE_WIDTH = 50


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks, as numpy's default; NaN if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Stat:
    """Mean, median and p99 of one latency, in milliseconds (NaN without samples)."""

    mean: float
    median: float
    p99: float

    @classmethod
    def of_seconds(cls, values: list[float]) -> Stat:
        ms = [1e3 * v for v in values]
        return cls(sum(ms) / len(ms) if ms else math.nan, percentile(ms, 50), percentile(ms, 99))


@dataclass(frozen=True)
class LoadReport:
    """One run: every request's outcome and the wall time from the first request sent to the last done."""

    outcomes: list[RequestOutcome]
    duration: float  # seconds
    max_concurrency: int | None  # None: unbounded
    request_rate: float  # requests per second; inf: all at once

    @property
    def ok(self) -> list[RequestOutcome]:
        return [o for o in self.outcomes if o.error is None]

    @property
    def errors(self) -> Counter[str]:
        """Failed requests by error message."""
        return Counter(o.error for o in self.outcomes if o.error is not None)

    @property
    def input_tokens(self) -> int:
        return sum(o.prompt_len for o in self.ok)

    @property
    def output_tokens(self) -> int:
        return sum(o.output_tokens for o in self.ok)

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the successful requests' usage says were cached; None when none of them says."""
        reported = [o.cached_tokens for o in self.ok if o.cached_tokens is not None]
        return sum(reported) if reported else None

    @property
    def request_throughput(self) -> float:
        return len(self.ok) / self.duration if self.duration > 0 else math.nan

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration if self.duration > 0 else math.nan

    @property
    def total_token_throughput(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration if self.duration > 0 else math.nan

    @property
    def ttft(self) -> Stat:
        return Stat.of_seconds([o.ttft for o in self.ok if o.ttft is not None])

    @property
    def tpot(self) -> Stat:
        return Stat.of_seconds([t for o in self.ok if (t := o.tpot) is not None])

    @property
    def itl(self) -> Stat:
        return Stat.of_seconds([gap for o in self.ok for gap in o.itl])

    @property
    def e2e(self) -> Stat:
        return Stat.of_seconds([o.e2e for o in self.ok if o.e2e is not None])

    def format(self) -> str:
        """The result block, line for line as ``vllm bench serve`` prints it, then the failed requests."""
        lines = [
            " Serving Benchmark Result ".center(RULE_WIDTH, "="),
            _line("Successful requests:", len(self.ok)),
            _line("Failed requests:", sum(self.errors.values())),
            _line("Maximum request concurrency:", self.max_concurrency or "unbounded"),
            _line("Request rate configured (RPS):", f"{self.request_rate:.2f}"),
            _line("Benchmark duration (s):", f"{self.duration:.2f}"),
            _line("Total input tokens:", self.input_tokens),
            _line("Total generated tokens:", self.output_tokens),
            _line("Request throughput (req/s):", f"{self.request_throughput:.2f}"),
            _line("Output token throughput (tok/s):", f"{self.output_throughput:.2f}"),
            _line("Total token throughput (tok/s):", f"{self.total_token_throughput:.2f}"),
        ]
        for title, short, stat in (
            ("Time to First Token", "TTFT", self.ttft),
            ("Time per Output Token (excl. 1st token)", "TPOT", self.tpot),
            ("Inter-token Latency", "ITL", self.itl),
            ("End-to-end Latency", "E2EL", self.e2e),
        ):
            lines.append(f" {title} ".center(RULE_WIDTH, "-"))
            lines += [
                _line(f"Mean {short} (ms):", f"{stat.mean:.2f}"),
                _line(f"Median {short} (ms):", f"{stat.median:.2f}"),
                _line(f"P99 {short} (ms):", f"{stat.p99:.2f}"),
            ]
        lines.append("=" * RULE_WIDTH)
        for error, count in self.errors.most_common(MAX_ERRORS_SHOWN):
            lines.append(f"failed ({count}x): {error}")
        if len(self.errors) > MAX_ERRORS_SHOWN:
            lines.append(f"... and {len(self.errors) - MAX_ERRORS_SHOWN} more distinct errors (see --json)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        """Aggregates (milliseconds for latencies; NaN as null) and every request's outcome, conversation by
        conversation and turn by turn."""
        stats = {"ttft": self.ttft, "tpot": self.tpot, "itl": self.itl, "e2e": self.e2e}
        summary: dict[str, object] = {
            "completed": len(self.ok),
            "failed": sum(self.errors.values()),
            "duration_s": self.duration,
            "max_concurrency": self.max_concurrency,
            "request_rate": None if math.isinf(self.request_rate) else self.request_rate,
            "total_input_tokens": self.input_tokens,
            "total_output_tokens": self.output_tokens,
            "request_throughput": _finite(self.request_throughput),
            "output_throughput": _finite(self.output_throughput),
            "total_token_throughput": _finite(self.total_token_throughput),
        }
        for name, stat in stats.items():
            summary[f"mean_{name}_ms"] = _finite(stat.mean)
            summary[f"median_{name}_ms"] = _finite(stat.median)
            summary[f"p99_{name}_ms"] = _finite(stat.p99)
        summary["errors"] = dict(self.errors)
        summary["requests"] = [
            {
                "prompt_len": o.prompt_len,
                "output_tokens": o.output_tokens,
                "ttft_s": o.ttft,
                "tpot_s": o.tpot,
                "e2e_s": o.e2e,
                "itl_s": list(o.itl),
                "cached_tokens": o.cached_tokens,
                "error": o.error,
            }
            for o in self.outcomes
        ]
        return summary


def _line(label: str, value: object) -> str:
    return f"{label:<40} {value}"


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value
