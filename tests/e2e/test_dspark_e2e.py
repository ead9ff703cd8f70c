"""A frontend and a CPU engine serving a DSpark drafter with a confidence threshold: /metrics equals the
engine's spec logs bin by bin (the verified and unverified drafts, the reached positions and the confidence
sums too) before and after the engine is SIGKILLed and restarted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.tools.spec_tally import tally_metrics, total
from tests.e2e.fault_checks import admin_engines, wait_for
from tests.e2e.processes import ADMIN_KEY, Cluster
from tests.e2e.settled_metrics import metrics_matching_logs

K = 7  # the checkpoint's block_size: the engine takes it from the folder


@pytest.fixture(scope="module")
def dspark_cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Cluster]:
    folder = make_tiny_dspark_checkpoint(
        tmp_path_factory.mktemp("dspark") / "d", tiny_model, seed=2, block_size=K, init_std=0.3
    )
    c = Cluster(tmp_path_factory.mktemp("dspark-cluster"))
    c.draft_folder = folder  # type: ignore[attr-defined]
    try:
        c.start_frontend("--spec-log-interval", "1", "--admin-api-key", ADMIN_KEY)
        start_engine(c, tiny_model, "spec-a.jsonl")
        c.wait_healthy()
        yield c
    finally:
        c.stop()


def start_engine(c: Cluster, model: Path, log: str) -> None:
    """The DSpark folder given without --spec-method or K: the engine serves it as dspark, K = 7."""
    folder = c.draft_folder  # type: ignore[attr-defined]
    c.start_engine(model, 0, "--draft-model", str(folder), "--confidence-threshold", "0.5",
                   "--spec-log", str(c.log_dir / log))  # fmt: skip


async def complete_all(session: aiohttp.ClientSession, url: str, seed: int) -> None:
    async def one(i: int) -> None:
        body = {"model": "tiny", "prompt": f"ROMEO {seed} {i}: But soft", "max_tokens": 30,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        async with session.post(f"{url}/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()

    await asyncio.gather(*(one(i) for i in range(6)))


async def test_metrics_equal_spec_logs_through_a_restart(dspark_cluster: Cluster, tiny_model: Path) -> None:
    c = dspark_cluster
    async with aiohttp.ClientSession() as s:
        await complete_all(s, c.url, 0)
        logs_a = [c.log_dir / "spec-a.jsonl"]
        text, before = await metrics_matching_logs(s, c.url, logs_a, K)
        assert tally_metrics(text)[0].bins(K, K + 1) == before.engines[0].bins(K, K + 1)
        first = admin_engines(c)[0]["incarnation"]
        c.kill("engine0")
        await wait_for(lambda: not admin_engines(c)[0]["up"], timeout=5)  # seen dead within seconds
        start_engine(c, tiny_model, "spec-b.jsonl")
        await wait_for(lambda: (e := admin_engines(c)[0])["up"] and e["incarnation"] != first, timeout=60)
        await complete_all(s, c.url, 1)
        logs = [*logs_a, c.log_dir / "spec-b.jsonl"]
        text, after = await metrics_matching_logs(s, c.url, logs, K)
    assert not after.malformed
    assert tally_metrics(text)[0].bins(K, K + 1) == after.engines[0].bins(K, K + 1)
    everything = total(after.engines.values())
    # the threshold left drafts out and verified others; the head's confidences were counted
    assert everything.num_unverified_tokens > 0 and everything.num_draft_tokens > 0
    assert sum(everything.confidence_micros_per_pos) > 0
    assert after.engines[0].bins(K, K + 1) != before.engines[0].bins(
        K, K + 1
    )  # the second incarnation counted
