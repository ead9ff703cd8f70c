"""Chaos, bounded in time: a frontend and three --fake-model engines with n-gram speculation under steady
streaming load; an engine is SIGKILLed at a random instant and restarted, another SIGSTOPped past the
timeout and resumed, the frontend SIGKILLed and restarted. No request hangs, no counter goes down, and the
final spec-decode totals equal exactly the spec-log lines the frontend counted (each line names the seq of
the snapshot that carries it; /admin/engines says which seqs of each incarnation were counted): with
--state-dir every line but a killed engine's unsent tail, all incarnations.

The instants are drawn from a seed printed by each test (``CHAOS_SEED=N`` replays one).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from openinfer.tools.spec_tally import AcceptanceTally, tally_metrics
from tests.e2e.fault_checks import admin_engines, assert_requests_ended, counted_logs, engines_idle, wait_for
from tests.e2e.load import Load, Scraper
from tests.e2e.processes import ADMIN_KEY, Cluster

K = 4
ENGINE_TIMEOUT_S = 2.0
ENGINE_ARGS = ("--spec-method", "ngram", "--num-spec-tokens", str(K), "--step-sleep", "0.01")


@pytest.fixture
def chaos_cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def start_engine(c: Cluster, index: int) -> None:
    c.start_fake_engine(index, *ENGINE_ARGS, "--spec-log", str(c.log_dir / f"spec{index}.jsonl"))


def chaos_rng() -> random.Random:
    """The test's instants, from $CHAOS_SEED or a fresh seed, printed so that a failure can be replayed."""
    seed = int(os.environ.get("CHAOS_SEED", random.SystemRandom().randrange(2**32)))
    print(f"CHAOS_SEED={seed}")
    return random.Random(seed)


async def test_chaos_with_state_dir(chaos_cluster: Cluster) -> None:
    """Kill at a random instant/restart, pause/resume, frontend SIGKILL/restart: all requests end, counters
    only go up, and /metrics equals exactly the spec logs but the killed engine's unsent tail."""
    c = chaos_cluster
    rng = chaos_rng()
    frontend_args = ("--state-dir", str(c.log_dir / "state"), "--engine-timeout", str(ENGINE_TIMEOUT_S))
    frontend_args += ("--admin-api-key", ADMIN_KEY)
    c.start_frontend(*frontend_args)
    for index in range(3):
        start_engine(c, index)
    c.wait_healthy(engines=3)
    load, scraper = Load(c.url, clients=8), Scraper(c.url)
    load.start()
    scraper.start()
    frontend_down: list[tuple[float, float]] = []
    try:
        await asyncio.sleep(3.0 + rng.uniform(0.0, 1.0))  # then at any instant of its step loop
        first = admin_engines(c)[0]["incarnation"]
        c.kill("engine0")
        await wait_for(lambda: not admin_engines(c)[0]["up"], timeout=5)  # seen dead within seconds
        start_engine(c, 0)
        await wait_for(lambda: (e := admin_engines(c)[0])["up"] and e["incarnation"] != first)

        await asyncio.sleep(2)
        c.kill("engine1", signal.SIGSTOP)
        await wait_for(lambda: not admin_engines(c)[1]["up"], timeout=ENGINE_TIMEOUT_S + 3)
        await asyncio.sleep(0.5)
        c.kill("engine1", signal.SIGCONT)
        await wait_for(lambda: admin_engines(c)[1]["up"], timeout=5)

        await asyncio.sleep(2.0 + rng.uniform(0.0, 1.0))
        killed = time.monotonic()
        c.kill("frontend")
        c.start_frontend(*frontend_args)
        await asyncio.to_thread(c.wait_healthy, 30.0, 3)
        frontend_down.append((killed, time.monotonic()))
        await asyncio.sleep(4)
    finally:
        await load.stop()
    await wait_for(lambda: engines_idle(c, 3))  # an idle engine's latest snapshot carries its last counters
    await scraper.stop()

    assert_requests_ended(load, frontend_down)
    assert load.of_kind("engine_error")  # the kill and the pause did fail some requests
    assert scraper.scrapes > 50 and not scraper.decreases, scraper.decreases[:5]
    assert scraper.last is not None
    with urllib.request.urlopen(f"{c.url}/metrics", timeout=5) as r:
        metrics = tally_metrics(r.read().decode())
    logs = counted_logs(c)
    assert set(metrics) == set(logs.engines) == {0, 1, 2}
    for index in range(3):
        assert logs.engines[index].num_drafts > 0, index  # something to compare
        assert metrics[index].bins(K, K + 1) == logs.engines[index].bins(K, K + 1), index
    # Only the killed incarnation can have lines no snapshot carried; this frontend saw every hello.
    assert set(logs.unsent) <= {0} and not logs.earlier, (logs.unsent, logs.earlier)
    assert (
        len(
            {json.loads(line)["incarnation"] for line in (c.log_dir / "spec0.jsonl").read_text().splitlines()}
        )
        == 2
    )
    with urllib.request.urlopen(f"{c.url}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'openinfer:engine_restarts_total{engine="0"} 1.0' in text
    # A real engine's seqs only go up, through a pause and a frontend restart too: a few may be dropped (kind
    # "seq") as a closed connection's leftovers read after the engine reconnected, but none was ever taken
    # for two processes sending as one incarnation (retired and told to stop), and every engine lives.
    assert 'kind="refused"' not in text
    assert "two processes send as this incarnation" not in (c.log_dir / "frontend.log").read_text()
    assert all(engine["up"] for engine in admin_engines(c).values())
    c.check_alive()


async def test_chaos_without_state_dir(chaos_cluster: Cluster) -> None:
    """Without --state-dir an engine kill and a frontend SIGKILL never count a draft twice: each frontend
    lifetime's totals, added up, stay within the spec logs, and the last lifetime's equal exactly the lines
    it counted."""
    c = chaos_cluster
    rng = chaos_rng()
    frontend_args = ("--engine-timeout", str(ENGINE_TIMEOUT_S), "--admin-api-key", ADMIN_KEY)
    c.start_frontend(*frontend_args)
    for index in range(2):
        start_engine(c, index)
    c.wait_healthy(engines=2)
    load, scraper = Load(c.url, clients=6), Scraper(c.url)
    load.start()
    scraper.start()
    frontend_down: list[tuple[float, float]] = []
    try:
        await asyncio.sleep(2.0 + rng.uniform(0.0, 1.0))
        c.kill("engine0")  # at any moment: what it drafted after its last snapshot is simply never counted
        start_engine(c, 0)
        await asyncio.sleep(2.0 + rng.uniform(0.0, 1.0))
        killed = time.monotonic()
        c.kill("frontend")
        scraper.new_lifetime()
        c.start_frontend(*frontend_args)
        await asyncio.to_thread(c.wait_healthy, 30.0, 2)
        frontend_down.append((killed, time.monotonic()))
        await asyncio.sleep(3)
    finally:
        await load.stop()
    await wait_for(lambda: engines_idle(c, 2))
    await scraper.stop()

    assert_requests_ended(load, frontend_down)
    assert not scraper.decreases, scraper.decreases[:5]
    with urllib.request.urlopen(f"{c.url}/metrics", timeout=5) as r:
        final = tally_metrics(r.read().decode())
    logs = counted_logs(c)  # split by what the last frontend counted
    assert set(final) == set(logs.engines) == {0, 1}
    for index in range(2):
        assert logs.engines[index].num_drafts > 0, index  # something to compare
        assert final[index].bins(K, K + 1) == logs.engines[index].bins(K, K + 1), index
    assert len(scraper.lifetimes) == 1
    earlier = tally_metrics_samples(scraper.lifetimes[0])
    assert sum(tally.num_drafts for tally in earlier.values()) > 0  # the first lifetime counted drafts
    for index in range(2):
        counted = final[index]
        counted.add(earlier.get(index, AcceptanceTally()))
        every_line = AcceptanceTally()
        for tallies in (logs.engines, logs.unsent, logs.earlier):
            every_line.add(tallies.get(index, AcceptanceTally()))
        for name, value in counted.bins(K, K + 1).items():
            assert value <= every_line.bins(K, K + 1)[name], (index, name)


def tally_metrics_samples(samples: dict) -> dict[int, AcceptanceTally]:  # type: ignore[type-arg]
    """tally_metrics over scraped samples (rebuilt as exposition text)."""
    lines = []
    for (name, labels), value in samples.items():
        label_text = ",".join(f'{k}="{v}"' for k, v in labels)
        lines.append(f"{name}{{{label_text}}} {value}")
    return tally_metrics("\n".join(lines) + "\n")
