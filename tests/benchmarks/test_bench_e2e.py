"""openinfer-bench against real frontend and engine processes: its acceptance table is the engines' spec logs,
its latencies are real, and its shared-prefix workloads run and report the prefix-cache deltas of /metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from openinfer.benchmarks.acceptance import AcceptanceReport, MetricsSnapshot
from openinfer.tools.spec_tally import read_spec_logs, total
from tests.e2e.processes import Cluster

K = 7
STEP_SLEEP_S = 0.05
# Repetitive prompts, so that n-gram lookups hit and some drafts are accepted.
PROMPTS = [
    "To be, or not to be, that is the question. " * 3,
    "ROMEO: But soft, what light through yonder window breaks? ROMEO: But soft, what light",
    "First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\nFirst Citizen:\n",
    "abc abc abc abc abc abc abc abc abc abc abc abc",
]


@pytest.fixture(scope="module")
def spec_cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Cluster]:
    """A frontend and two CPU engines with ngram K=7, each writing its spec log under log_dir/spec."""
    c = Cluster(tmp_path_factory.mktemp("bench"))
    (c.log_dir / "spec").mkdir()
    try:
        c.start_frontend()
        for index in (0, 1):
            spec_log = str(c.log_dir / "spec" / f"spec{index}.jsonl")
            c.start_engine(
                tiny_model,
                index,
                "--spec-method",
                "ngram",
                "--num-spec-tokens",
                str(K),
                "--spec-log",
                spec_log,
            )
        c.wait_healthy(engines=2)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def fake_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two --fake-model engines: "fake" at full speed and "slow", which sleeps STEP_SLEEP_S after each step."""
    c = Cluster(tmp_path_factory.mktemp("fake"))
    try:
        c.start_frontend()
        c.start_fake_engine(0)
        c.start_fake_engine(1, "--served-model-name", "slow", "--step-sleep", str(STEP_SLEEP_S))
        c.wait_healthy(engines=2)
        yield c
    finally:
        c.stop()


def bench(url: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run openinfer-bench as a user would; returns the process and its --json report."""
    out = Path(args[args.index("--json") + 1])
    command = [sys.executable, "-m", "openinfer.benchmarks.bench", "--base-url", url, "--disable-tqdm", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text())


def drafts_on_metrics(url: str) -> int:
    """The sum of every vllm:spec_decode_num_drafts_total series, read with a regex (as PromQL sum() would)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return round(
        sum(float(v) for v in re.findall(r"^vllm:spec_decode_num_drafts_total\{[^}]*\} (\S+)$", text, re.M))
    )


def test_acceptance_table_equals_spec_logs(spec_cluster: Cluster, tmp_path: Path) -> None:
    """Against a frontend + 2 ngram engines: the printed table (summed and per engine) is the table of the
    engines' spec logs exactly, --spec-logs agrees, and rounds equal the num_drafts_total delta."""
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p, "max_tokens": 24}) + "\n" for p in PROMPTS))
    drafts_before = drafts_on_metrics(spec_cluster.url)
    done, report = bench(
        spec_cluster.url,
        "--model", "tiny", "--dataset-name", "jsonl", "--dataset-path", str(dataset), "--num-prompts", "8",
        "--max-concurrency", "4", "--ignore-eos", "--num-warmups", "0",
        "--spec-logs", str(spec_cluster.log_dir / "spec"), "--json", str(tmp_path / "out.json"),
    )  # fmt: skip
    drafts_after = drafts_on_metrics(spec_cluster.url)

    logs = read_spec_logs(sorted((spec_cluster.log_dir / "spec").glob("*.jsonl")))  # this run's drafts only
    assert not logs.malformed and set(logs.engines) == {0, 1}  # both engines drafted
    everything = total(logs.engines.values())
    assert everything.num_accepted_tokens > 0  # some lookups hit: the histogram is more than bin 0

    # The table printed is the one the logs give, row by row.
    from_logs = MetricsSnapshot(logs.engines, has_histogram=True, started=0.0, finished=0.0, settled=True)
    expected = AcceptanceReport(MetricsSnapshot({}, True, 0.0, 0.0, True), from_logs).format()
    assert expected in done.stdout
    assert "agree with the /metrics deltas bin by bin" in done.stdout
    assert "temperature 0.0 (greedy)" in done.stdout  # the default, always said
    assert report["spec_logs"]["agree"] is True

    acceptance = report["acceptance"]
    assert acceptance["all"] == everything.to_json()
    assert acceptance["engines"] == {str(i): t.to_json() for i, t in sorted(logs.engines.items())}
    assert acceptance["all"]["num_drafts"] == drafts_after - drafts_before
    assert report["load"]["completed"] == 8 and report["load"]["total_output_tokens"] == 8 * 24


def test_slowed_engine_shows_in_tpot(fake_cluster: Cluster, tmp_path: Path) -> None:
    """Latencies come from real timestamps: an engine sleeping 0.05 s per step gives TPOT >= 50 ms, and the
    same requests to a full-speed engine do not."""
    common = [
        "--dataset-name",
        "random",
        "--num-prompts",
        "2",
        "--max-concurrency",
        "1",
        "--random-input-len",
        "8",
    ]
    common += ["--random-output-len", "8", "--ignore-eos", "--num-warmups", "0"]
    _, fast = bench(fake_cluster.url, "--model", "fake", *common, "--json", str(tmp_path / "fast.json"))
    _, slow = bench(fake_cluster.url, "--model", "slow", *common, "--json", str(tmp_path / "slow.json"))
    for report in (fast, slow):
        assert report["load"]["completed"] == 2 and report["load"]["total_output_tokens"] == 16
    assert slow["load"]["median_tpot_ms"] >= 1e3 * STEP_SLEEP_S
    assert slow["load"]["median_itl_ms"] >= 1e3 * STEP_SLEEP_S  # one token per step and per chunk
    assert slow["load"]["mean_e2e_ms"] >= 7 * 1e3 * STEP_SLEEP_S  # 7 steps after the first token
    assert fast["load"]["median_tpot_ms"] < 1e3 * STEP_SLEEP_S


def prefix_counters(url: str) -> tuple[int, int] | None:
    """(queries, hits) summed over every vllm:prefix_cache_* series, read with a regex (as PromQL sum() would);
    None when /metrics has neither."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    sums = []
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        values = re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
        sums.append(round(sum(float(v) for v in values)) if values else None)
    return None if sums == [None, None] else (sums[0] or 0, sums[1] or 0)


def check_prefix_cache(
    report: dict, stdout: str, before: tuple[int, int] | None, after: tuple[int, int] | None
) -> None:
    """The report's prefix-cache figures are what /metrics and the requests' usage said, whatever they were:
    n/a without the counters, else the deltas; cached tokens are the usage's sum, and equal the hits."""
    figures = report["prefix_cache"]
    line = next(line for line in stdout.splitlines() if line.startswith("Prefix cache hit rate (/metrics):"))
    if after is None:
        assert before is None and (figures["queries"], figures["hits"], figures["hit_rate"]) == (None,) * 3
        assert line.split(":", 1)[1].split()[0] == "n/a"
    else:
        queries, hits = after[0] - (before or (0, 0))[0], after[1] - (before or (0, 0))[1]
        assert (figures["queries"], figures["hits"]) == (queries, hits)
        assert figures["hit_rate"] == (hits / queries if queries else None)
    cached = [r["cached_tokens"] for r in report["load"]["requests"] if r["cached_tokens"] is not None]
    assert figures["cached_tokens"] == (sum(cached) if cached else None)
    if cached and after is not None:
        assert figures["cached_tokens"] == figures["hits"]  # every hit is a cached prompt token of a request


def test_prefix_repetition_reports_the_prefix_cache_deltas(
    fake_cluster: Cluster, sonnets_path: Path, tmp_path: Path
) -> None:
    """6 requests over 2 prefixes of 64 tokens (+ 16 of their own) to a fake engine: all complete with the
    80-token prompts the server counts too, and the hit rate is the /metrics deltas (n/a while the engine
    exports no prefix-cache counters)."""
    before = prefix_counters(fake_cluster.url)
    done, report = bench(
        fake_cluster.url,
        "--model", "fake", "--dataset-name", "prefix_repetition", "--dataset-path", str(sonnets_path),
        "--prefix-repetition-prefix-len", "64", "--prefix-repetition-suffix-len", "16",
        "--prefix-repetition-num-prefixes", "2", "--prefix-repetition-output-len", "4", "--num-prompts", "6",
        "--max-concurrency", "2", "--ignore-eos", "--num-warmups", "0", "--json", str(tmp_path / "out.json"),
    )  # fmt: skip
    after = prefix_counters(fake_cluster.url)
    load = report["load"]
    assert (load["completed"], load["failed"], load["total_output_tokens"]) == (6, 0, 6 * 4)
    assert [r["prompt_len"] for r in load["requests"]] == [80] * 6  # the server's usage: 64 + 16
    assert report["config"]["prefix_repetition_num_prefixes"] == 2
    check_prefix_cache(report, done.stdout, before, after)
    # Engines cache prefixes by default: every request after the first of its prefix finds the prefix's 4
    # blocks (its own 16 tokens, in the block of its last token, are computed).
    hits = report["prefix_cache"]["hits"]
    assert 4 * 64 <= hits <= 6 * 64 and hits % 16 == 0


def test_multi_turn_replays_conversations(fake_cluster: Cluster, sonnets_path: Path, tmp_path: Path) -> None:
    """2 chat conversations of 3 turns: 6 requests, each turn's prompt (as the server counts it) longer than
    the previous turn's by its reply and a 16-token user message at least; hit rate as /metrics says."""
    before = prefix_counters(fake_cluster.url)
    done, report = bench(
        fake_cluster.url,
        "--model", "fake", "--endpoint", "chat", "--dataset-name", "multi_turn",
        "--dataset-path", str(sonnets_path), "--num-prompts", "2", "--multi-turn-num-turns", "3",
        "--multi-turn-user-len", "16", "--multi-turn-output-len", "8", "--max-concurrency", "2",
        "--ignore-eos", "--num-warmups", "0", "--json", str(tmp_path / "out.json"),
    )  # fmt: skip
    after = prefix_counters(fake_cluster.url)
    assert "2 conversations of 3 turns (6 requests)" in done.stdout
    load = report["load"]
    assert (load["completed"], load["failed"], load["total_output_tokens"]) == (6, 0, 6 * 8)
    prompt_lens = [r["prompt_len"] for r in load["requests"]]  # conversation by conversation, turn by turn
    for turns in (prompt_lens[:3], prompt_lens[3:]):
        assert turns[0] >= 16 and all(later > earlier + 16 for earlier, later in pairwise(turns))
    check_prefix_cache(report, done.stdout, before, after)
    assert report["prefix_cache"]["hits"] >= 2 * 16  # later turns find the earlier ones' full blocks
