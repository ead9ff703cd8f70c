"""Prefix caching through the whole stack: each response's cached tokens are what vLLM's semantics give, and
/metrics counts exactly the prompt tokens sent and the cached tokens reported, through an engine restart
(the new incarnation's cache starts empty; the series go on)."""

from __future__ import annotations

import signal
import time
import urllib.request
from pathlib import Path

from openinfer.benchmarks.prefix_cache_check import counters, run, sequence
from tests.e2e.processes import Cluster

MAX_TOKENS = 12
# first: 60 tokens; same: all but its last (partial) block; prefix: 32 tokens, all cached but its last block;
# other: shares 40 tokens (2 blocks) of the prefix, and the duplicate all 3 of its full blocks; follow-up:
# the first turn, its answer and 5 tokens (60 + 11 computed tokens: 4 blocks); long: 100, then 109 tokens.
EXPECTED = {"first": 0, "same": 48, "prefix": 16, "other": 32, "other again": 48, "follow-up": 64,
            "unrelated": 0, "long": 0, "long + 9": 96}  # fmt: skip


def restarts(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return next(
        (line for line in lines if line.startswith('openinfer:engine_restarts_total{engine="0"}')), ""
    )


def test_cached_tokens_and_counters_through_a_restart(tmp_path: Path, tiny_model: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_frontend()
        cluster.start_engine(tiny_model)
        cluster.wait_healthy()
        requests = sequence(vocab_size=512, seed=0, long_len=100)
        result = run(cluster.url, requests, MAX_TOKENS)
        assert result["cached_tokens"] == EXPECTED
        assert result["queries"] == result["prompt_tokens"] and result["hits"] == sum(EXPECTED.values())

        before = counters(cluster.url)
        cluster.kill("engine0", signal.SIGKILL)
        cluster.start_engine(tiny_model)
        deadline = time.monotonic() + 60
        while not restarts(cluster.url).endswith(" 1.0") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert restarts(cluster.url).endswith(" 1.0"), cluster.logs()
        cluster.wait_healthy()
        again = run(cluster.url, requests[:2], MAX_TOKENS)
        assert again["cached_tokens"] == {"first": 0, "same": 48}
        after = counters(cluster.url)
        assert again["queries"] == 120 and again["hits"] == 48
        assert after == {k: before[k] + (120 if k.endswith("queries") else 48) for k in before}
    finally:
        cluster.stop()
