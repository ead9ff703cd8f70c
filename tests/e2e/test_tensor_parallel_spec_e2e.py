"""N-gram speculation on an engine over two CPU ranks (``-tp 2 --spec-method ngram``, gloo on loopback) as
real processes: greedy completions equal a one-rank engine's without speculation, drafts are accepted, and
/metrics equals the engine's spec log bin by bin; adaptive verification measures its step costs through the
ranks; at run time a DFlash drafter loads (it drafts on rank 0) and an n-gram one after it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.tools.spec_tally import tally_metrics
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster
from tests.e2e.rank_processes import cluster_log, greedy_token_ids, rank_pids, stop_with_ranks
from tests.e2e.settled_metrics import metrics_matching_logs

K = 4
MAX_TOKENS = 32


def prompts() -> list[list[int]]:
    """Token prompts (the tiny model's 512-token vocabulary) whose greedy continuations repeat themselves, so
    lookups hit (the 42s and 17s of the first, the 11-12 pairs' 40 7 502), one of random ids whose
    continuation mostly misses, and one prefilled in chunks of 16 tokens."""
    return [
        [42] * 10,
        [11, 12] * 8,
        [64, 404, 303],
        [224, 446, 147],
        [346, 12, 66, 53, 470, 76, 355, 464, 504, 94, 30, 7, 5, 9, 150, 8, 77, 19, 280, 3],
    ]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Cluster]]:
    """Three frontends, each with one engine serving the tiny model: "reference" at -tp 1 without a drafter;
    "ngram" at -tp 2 with n-gram K=4 (admin API on); "adaptive" the same with adaptive verification. The
    two-rank engines write spec logs and prefill in chunks of 16 tokens; "ngram" may load drafters from the
    folder of a DFlash drafter for the tiny model (``cluster.dflash``)."""
    started = {name: Cluster(tmp_path_factory.mktemp(name)) for name in ("reference", "ngram", "adaptive")}
    dflash = make_tiny_dflash_checkpoint(tmp_path_factory.mktemp("drafters") / "d", tiny_model)
    started["ngram"].dflash = dflash  # type: ignore[attr-defined]
    try:
        started["reference"].start_frontend()
        started["reference"].start_engine(tiny_model, 0, "-tp", "1")
        allowed = ["--allowed-drafter-dir", str(dflash.parent)]
        for name, extra in (("ngram", allowed), ("adaptive", ["--enable-adaptive-verification"])):
            cluster = started[name]
            assert cluster.log_dir is not None
            cluster.start_frontend("--admin-api-key", ADMIN_KEY)
            spec = ["--spec-method", "ngram", "--num-spec-tokens", str(K)]
            spec += ["--spec-log", str(cluster.log_dir / "spec0.jsonl"), *extra]
            cluster.start_engine(tiny_model, 0, "-tp", "2", "--max-num-batched-tokens", "16", *spec)
        for cluster in started.values():
            cluster.wait_healthy(timeout=120)
        yield started
    finally:
        for cluster in started.values():
            stop_with_ranks(cluster, 0)


async def _reference(clusters: dict[str, Cluster]) -> list[list[int]]:
    tokens = await greedy_token_ids(clusters["reference"].url, prompts(), MAX_TOKENS)
    assert all(len(t) == MAX_TOKENS for t in tokens)
    return tokens


async def _lossless_and_counted(cluster: Cluster, reference: list[list[int]]) -> dict[str, int]:
    """Completions on ``cluster`` equal ``reference``, and its /metrics equals its spec log bin by bin
    (per-position accepted and drafted, the accepted-length histogram, drafts, draft, accepted and unverified
    tokens); the log's bins."""
    assert cluster.log_dir is not None
    async with aiohttp.ClientSession() as session:
        assert await greedy_token_ids(cluster.url, prompts(), MAX_TOKENS) == reference
        text, logs = await metrics_matching_logs(session, cluster.url, [cluster.log_dir / "spec0.jsonl"], K)
    assert not logs.malformed and set(logs.engines) == {0}
    bins = logs.engines[0].bins(K, K + 1)
    assert tally_metrics(text)[0].bins(K, K + 1) == bins
    return bins


async def test_ngram_on_two_ranks_is_lossless_and_counted_exactly(clusters: dict[str, Cluster]) -> None:
    """-tp 2 with n-gram K=4: greedy tokens equal -tp 1's without speculation, some drafts are accepted (and
    some not), /metrics equals the spec log bin by bin, and openinfer-verify-log agrees (exit 0)."""
    cluster = clusters["ngram"]
    bins = await _lossless_and_counted(cluster, await _reference(clusters))
    assert 0 < bins["accepted_tokens"] < bins["draft_tokens"]
    assert bins["drafts"] > 0 and sum(bins[f"per_pos[{i}]"] for i in range(K)) == bins["accepted_tokens"]
    assert cluster.log_dir is not None
    checker = subprocess.run(
        [sys.executable, "-m", "openinfer.tools.verify_log", "--metrics-url", f"{cluster.url}/metrics"]
        + ["--spec-log", str(cluster.log_dir / "spec0.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checker.returncode == 0, checker.stdout + checker.stderr
    log = cluster_log(cluster, "engine0")
    assert len(rank_pids(log)) == 1 and "tensor parallel over 2 ranks" in log


async def test_adaptive_verification_measures_its_step_costs_through_the_ranks(
    clusters: dict[str, Cluster],
) -> None:
    """--enable-adaptive-verification at -tp 2: the start-time step-cost profile runs its steps on both ranks
    (the engine comes up and logs the costs), and the steps after it stay lossless and exactly counted."""
    cluster = clusters["adaptive"]
    await _lossless_and_counted(cluster, await _reference(clusters))
    assert "step costs measured for adaptive verification" in cluster_log(cluster, "engine0")


async def test_run_time_drafter_loads_on_two_ranks(clusters: dict[str, Cluster]) -> None:
    """Admin API on the -tp 2 engine: a DFlash drafter of the same K loads (rank 0 drafts with its copy of the
    embedding and LM head) and the engine stays lossless and exactly counted; then an n-gram one loads and
    the counters go on."""
    cluster = clusters["ngram"]
    url = f"{cluster.url}/admin/engines/0/drafter"
    draft_model = str(cluster.dflash)  # type: ignore[attr-defined]
    for body in (
        {"method": "dflash", "num_spec_tokens": K, "draft_model": draft_model},
        {"method": "ngram", "num_spec_tokens": K, "prompt_lookup_min": 2},
    ):
        async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as s:
            async with s.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["num_spec_tokens"] == K
        await _lossless_and_counted(cluster, await _reference(clusters))
    assert "rank 0: drafter's embedding/LM head copy" in cluster_log(cluster, "engine0")
