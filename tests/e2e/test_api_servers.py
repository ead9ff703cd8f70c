"""Several frontends over the same engines, with real processes: ``openinfer-serve --api-server-count 2``
under streaming load through an engine SIGKILL and an api server SIGKILL (serve restarts both), and two
``openinfer-frontend``s started apart, each scraped on its own port. Summed over engines, /metrics equals
the spec logs bin by bin; no counter ever goes down; each engine's series are exported once."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openinfer.frontend.metrics.api_servers import ApiServerView
from openinfer.tools.spec_tally import read_spec_logs, tally_metrics
from tests.e2e.fault_checks import admin_engines, assert_requests_ended, counted_logs, engines_idle, wait_for
from tests.e2e.load import CYCLE_PROMPT, Load, Scraper
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster, cmdline
from tests.e2e.serve_under_test import Serve

K = 4
SPEC = ("--spec-method", "ngram", "--num-spec-tokens", str(K), "--step-sleep", "0.01")


def engine_series(text: str) -> dict[str, set[str]]:
    """By engine label, the families that have a series of it (the request metrics, this frontend's own
    requests, aside)."""
    own = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success")
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "engine" in s.labels and family.name not in own:
                found.setdefault(s.labels["engine"], set()).add(family.name)
    return found


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        return r.read().decode()  # type: ignore[no-any-return]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    flags = ("--engines", "2", "--api-server-count", "2", "--spec-log-dir", str(tmp_path), *SPEC)
    s = Serve(tmp_path, *flags, "--admin-api-key", ADMIN_KEY, "--engine-timeout", "2", api_servers=2)
    try:
        yield s
    finally:
        s.close()


async def test_api_servers_metrics_equal_spec_logs_through_kills(serve: Serve) -> None:
    """Load spread over two api servers; engine 0 and then api server 1 SIGKILLed and restarted by serve:
    requests end (only the killed api server's with a broken connection), no scrape of the shared port
    ever shows a counter lower than an earlier one, and the final scrape equals the spec logs, engine by
    engine, but the killed engine's unsent tail; each api server relayed requests."""
    c = serve.cluster
    serve.wait_serving()
    load, scraper = Load(c.url, clients=6, new_connections=True), Scraper(c.url, new_connections=True)
    load.start()
    scraper.start()
    down: list[tuple[float, float]] = []
    try:
        await asyncio.sleep(2.0)
        first = admin_engines(c)[0]["incarnation"]
        os.kill(serve.wait_for("engine0"), signal.SIGKILL)
        await wait_for(lambda: (e := admin_engines(c)[0])["up"] and e["incarnation"] != first)

        await asyncio.sleep(2.0)
        killed_pid = serve.wait_for("api-server1")
        killed = time.monotonic()
        os.kill(killed_pid, signal.SIGKILL)
        await asyncio.to_thread(serve.wait_for, "api-server1", killed_pid)
        await wait_for(lambda: re.search(r"api server 1 is listening on \S+ again", serve.log()) is not None)
        down.append((killed, time.monotonic()))
        await asyncio.sleep(2.0)
    finally:
        await load.stop()
    await wait_for(lambda: engines_idle(c, 2))  # an idle engine's latest snapshot carries its last counters
    await asyncio.sleep(1.5)  # every api server took its engines' idle snapshots (heartbeats: 0.5 s)
    await scraper.stop()

    assert_requests_ended(load, down)
    assert scraper.scrapes > 20 and not scraper.decreases, scraper.decreases[:5]
    text = scrape(c.url)
    metrics, logs = tally_metrics(text), counted_logs(c)
    assert set(metrics) == set(logs.engines) == {0, 1}
    for index in range(2):
        assert logs.engines[index].num_drafts > 0, index
        assert metrics[index].bins(K, K + 1) == logs.engines[index].bins(K, K + 1), index
    assert set(logs.unsent) <= {0} and not logs.earlier, (logs.unsent, logs.earlier)
    assert 'openinfer:engine_restarts_total{engine="0"} 1.0' in text
    assert text.count('openinfer:engine_up{engine="1"}') == 1
    # Each api server relayed requests (its own view: its exposition alone).
    peers = Path(
        next(a.split("=", 1)[1] for a in cmdline(serve.wait_for("api-server0")) if "--peers-dir" in a)
    )
    for index in range(2):
        view = msgspec.msgpack.decode((peers / f"api-server-{index}.view").read_bytes(), type=ApiServerView)
        success = [
            s.value
            for family in text_string_to_metric_families(view.exposition)
            for s in family.samples
            if s.name == "vllm:request_success_total"
        ]
        assert sum(success) > 0, index


async def test_drafter_changes_lose_no_draft_made_for_another_frontend(tmp_path: Path) -> None:
    """Issue 39: one engine behind two openinfer-frontends, six streams and the drafter commands all sent to
    frontend 1 while frontend 0 exports the engine's counters; the drafter cycles K=5 -> K=7 -> unloaded ->
    K=4 three times. The drafts frontend 1's requests made since frontend 0's last message are not lost when a
    change starts the counters from zero: frontend 0's /metrics equals the spec log bin by bin (every K), no
    scrape of it shows a counter lower than an earlier one, and it counted no protocol error."""
    c = Cluster(tmp_path, frontends=2, num_http_ports=2)
    urls = [f"http://127.0.0.1:{port}" for port in c.http_ports]
    try:
        for index in range(2):
            c.start_frontend("--admin-api-key", ADMIN_KEY, index=index, http_port=c.http_ports[index])
        c.start_fake_engine(0, *SPEC, "--spec-log", str(tmp_path / "spec0.jsonl"))
        for url in urls:
            await wait_for(lambda url=url: '"engines_up": 1' in health(url))
        load, scraper = Load(urls[1], clients=6), Scraper(urls[0])
        load.start()
        scraper.start()
        route = f"{urls[1]}/admin/engines/0/drafter"
        try:
            async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as session:
                for _ in range(3):
                    for body in ({"method": "ngram", "num_spec_tokens": 5},
                                 {"method": "ngram", "num_spec_tokens": 7}, None,
                                 {"method": "ngram", "num_spec_tokens": K}):  # fmt: skip
                        await asyncio.sleep(0.4)  # drafts made meanwhile, for frontend 1's requests
                        change = session.post(route, json=body) if body else session.delete(route)
                        async with change as r:
                            assert r.status == 200, await r.text()
        finally:
            await load.stop()
        await wait_for(lambda: engines_idle(c, 1))
        await asyncio.sleep(1.5)  # frontend 0 took the engine's idle snapshots (heartbeats: 0.5 s)
        await scraper.stop()
        text, logs = scrape(urls[0]), counted_logs(c)
    finally:
        c.stop()
    assert_requests_ended(load, [])
    assert scraper.scrapes > 5 and not scraper.decreases, scraper.decreases[:5]
    errors = [s for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "openinfer:protocol_errors_total" and s.value]  # fmt: skip
    assert not errors, errors
    assert logs.engines[0].num_drafts > 0 and not logs.earlier
    assert tally_metrics(text)[0].bins(7, 8) == logs.engines[0].bins(7, 8)


async def test_frontends_started_apart_sum_to_each_engine_once(tmp_path: Path) -> None:
    """Two openinfer-frontends over two engines, each on its own port: each engine's counters and gauges
    are at its metrics frontend only, and the two scrapes summed equal the spec logs; requests sent to
    either frontend are answered by it."""
    c = Cluster(tmp_path, frontends=2, num_http_ports=2)
    ports = c.http_ports
    try:
        for index in range(2):
            c.start_frontend(index=index, http_port=ports[index])
        for index in range(2):
            c.start_fake_engine(index, *SPEC, "--spec-log", str(tmp_path / f"spec{index}.jsonl"))
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url in urls:
            await wait_for(lambda url=url: '"engines_up": 2' in health(url))
        body = {"model": "fake", "prompt": CYCLE_PROMPT, "max_tokens": 24, "ignore_eos": True}
        async with aiohttp.ClientSession() as session:

            async def complete(url: str) -> None:
                async with session.post(f"{url}/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()

            await asyncio.gather(*(complete(urls[i % 2]) for i in range(16)))
        await asyncio.sleep(1.5)  # both frontends took the engines' idle snapshots
        texts = [scrape(url) for url in urls]
    finally:
        c.stop()
    assert {e: "vllm:spec_decode_num_drafts" in f for e, f in engine_series(texts[0]).items()} == {"0": True}
    assert {e: "vllm:spec_decode_num_drafts" in f for e, f in engine_series(texts[1]).items()} == {"1": True}
    assert engine_series(texts[0])["0"] == engine_series(texts[1])["1"]  # the same families, each engine once
    summed = tally_metrics(texts[0]) | tally_metrics(texts[1])
    logs = read_spec_logs(sorted(tmp_path.glob("spec*.jsonl")))
    assert set(summed) == set(logs.engines) == {0, 1}
    for index in range(2):
        assert logs.engines[index].num_drafts > 0
        assert summed[index].bins(K, K + 1) == logs.engines[index].bins(K, K + 1), index
    for text in texts:  # each frontend answered its own 8 requests
        requests = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == "vllm:request_success_total"]  # fmt: skip
        assert sum(requests) == 8


def health(url: str) -> str:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.read().decode()  # type: ignore[no-any-return]
    except OSError:
        return ""
