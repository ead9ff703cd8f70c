"""One live host of the deploy tests: a frontend, its engines' spec logs and its Prometheus, a load, and the
waits after which the host's recorded values must equal its spec logs exactly (tests/deploy/
test_prometheus_live.py says why). Its frontend and Prometheus may run as processes or as containers."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import aiohttp

from openinfer.tools.spec_tally import AcceptanceTally, read_spec_logs, tally_metrics
from tests.deploy.stack import LiveFrontend, Prometheus, Watched, wait_until

WINDOW = 60.0  # the rules' rate window, seconds


@dataclass
class Host:
    name: str
    frontend: LiveFrontend
    prometheus: Prometheus
    t_zero: float = 0.0  # timestamp of the first scrape: every spec-decode counter at 0
    t_final: float = 0.0  # after this, every scrape sees the final counters
    t_eval: float = 0.0  # a rules evaluation whose window holds the zero scrape and a final one
    logs: dict[int, AcceptanceTally] = field(default_factory=dict)  # the spec logs, per engine index


def prompts(n: int, seed: int) -> list[str | list[int]]:
    """Repetitive text and repeated token ids (n-gram lookups hit), random token ids (they mostly miss)."""
    rng = random.Random(seed)
    repeated = "To be, or not to be, that is the question. " * 4
    pool: list[str | list[int]] = [
        repeated,
        [rng.randrange(3, 512) for _ in range(9)] * 3,
        repeated[5:],
        [rng.randrange(3, 512) for _ in range(40)],
    ]
    return [pool[i % len(pool)] for i in range(n)]


async def run_load(frontends: list[tuple[LiveFrontend, int]]) -> None:
    """``n`` concurrent greedy completions on each frontend; returns when all have finished."""

    async def one(session: aiohttp.ClientSession, url: str, prompt: str | list[int]) -> None:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        async with session.post(f"{url}/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(
            *(one(session, f.url, p) for i, (f, n) in enumerate(frontends) for p in prompts(n, seed=i))
        )


def spec_series(prometheus: Prometheus, at: float | None = None) -> list[dict]:
    return prometheus.query(
        '{__name__=~"vllm:spec_decode_.+_total|openinfer:spec_decode_(accepted_length|num_draft_tokens_per_pos|'
        'num_unverified_draft_tokens|num_reached_per_pos|confidence_micros_per_pos)_total"}[5m]',
        at,
    )


def wait_for_zero_scrape(host: Host, processes: Watched) -> None:
    """Until the host's Prometheus has scraped every engine's series; they must all start at 0, together."""
    engines = host.frontend.num_engines
    wait_until(
        lambda: len(host.prometheus.query("vllm:spec_decode_num_drafts_total")) == engines,
        30,
        f"host {host.name}'s first scrape",
        processes,
    )
    series = spec_series(host.prometheus)
    firsts = {(float(s["values"][0][0]), s["values"][0][1]) for s in series}
    assert len(firsts) == 1, f"host {host.name}: series did not all start in one scrape at 0: {firsts}"
    ((host.t_zero, value),) = firsts
    assert float(value) == 0


def wait_for_final_counters(host: Host, processes: Watched) -> None:
    """Until the frontend's /metrics equals its engines' spec logs; then every later scrape is final."""
    engines = range(host.frontend.num_engines)

    def final() -> bool:
        logs = read_spec_logs(host.frontend.spec_logs)
        assert not logs.malformed, logs.malformed
        metrics = tally_metrics(host.frontend.metrics())
        if any(metrics[e].bins() != logs.engines.get(e, AcceptanceTally()).bins() for e in engines):
            return False
        host.logs = {e: logs.engines.get(e, AcceptanceTally()) for e in engines}
        return True

    wait_until(final, 15, f"host {host.name}'s /metrics to equal its spec logs", processes)
    host.t_final = time.time()
    # The first rules evaluation at least one scrape interval (plus a margin to commit it) after t_final.
    earliest = host.t_final + 1.5

    def evaluated() -> bool:
        stamps = [t for t, _ in host.prometheus.samples("model_name:spec_decode_num_drafts:sum[10s]")]
        whole = [t for t in stamps if t >= earliest and whole_evaluation(host, t)]
        if whole:
            host.t_eval = min(whole)
        return bool(whole)

    wait_until(evaluated, 10, f"host {host.name}'s rules evaluation after the load, on one scrape", processes)
    assert host.t_eval <= host.t_zero + WINDOW - 0.5, (
        f"host {host.name}: the load ended too late ({host.t_eval - host.t_zero:.1f} s after the first "
        f"scrape) for the {WINDOW:.0f} s window to still hold the zero scrape"
    )


def whole_evaluation(host: Host, at: float) -> bool:
    """Whether the rules evaluation at ``at`` read one scrape throughout. Prometheus (2.42, Debian's) runs a
    group's rules one after another, each reading what is committed at that moment, so a scrape committed
    mid-evaluation gives the first rules the scrape before and the rest the new one: rate() extrapolates
    each from a different last sample, and a ratio of two of them is off by far more than rounding (seen
    once in CI, on a loaded machine). In a whole evaluation after the load, every series starting at 0 in
    the zero scrape, each engine:...:rate1m series is its spec-log count times one factor, the same for all;
    the checks then test what the ratio and sum rules make of those rates."""
    factors, zeros = [], []
    for series in host.prometheus.query('{__name__=~"engine:spec_decode_.+:rate1m"}', at):
        count = rated_count(host.logs[int(series["metric"]["engine"])], series["metric"])
        rate = float(series["value"][1])
        if count:
            factors.append(rate / count)
        else:
            zeros.append(rate)
    return bool(factors) and not any(zeros) and all(abs(f / factors[0] - 1) < 1e-12 for f in factors)


# engine:spec_decode_NAME:rate1m -> the AcceptanceTally bin it is the rate of (formatted with its labels).
RATED_BINS = {
    "num_drafts": "drafts",
    "num_draft_tokens": "draft_tokens",
    "num_accepted_tokens": "accepted_tokens",
    "num_accepted_tokens_per_pos": "per_pos[{position}]",
    "accepted_length": "hist[{accepted}]",
    "num_draft_tokens_per_pos": "draft_per_pos[{position}]",
    "num_unverified_draft_tokens": "unverified_tokens",
    "num_reached_per_pos": "reached_per_pos[{position}]",
    "confidence_micros_per_pos": "confidence_micros_per_pos[{position}]",
}


def rated_count(tally: AcceptanceTally, metric: dict[str, str]) -> int:
    """The spec-log count of one engine that an engine:spec_decode_*:rate1m series is the rate of."""
    name = metric["__name__"].removeprefix("engine:spec_decode_").removesuffix(":rate1m")
    return tally.bins().get(RATED_BINS[name].format(**metric), 0)
