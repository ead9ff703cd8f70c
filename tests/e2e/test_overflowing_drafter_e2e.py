"""A DSpark drafter with finite weights whose numbers overflow at run time (issue 39, item 3), started with a
real engine behind a real frontend: every request succeeds (it failed with 500, "confidences must be finite
numbers"), with the tokens the engine gives without speculation, /metrics equals the spec log (confidence
sums 0), and the engine logs it once."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import torch
from safetensors.torch import load_file, save_file

from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.tools.spec_tally import tally_metrics
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster
from tests.e2e.settled_metrics import metrics_matching_logs

K = 7  # the drafter's block_size: the engine takes K from the folder
HUGE = 3e38  # finite in float32: the load takes it; the first matmul overflows (NaN hidden states)


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A DSpark drafter whose fc weights are all HUGE."""
    root = tmp_path_factory.mktemp("drafters")
    good = make_tiny_dspark_checkpoint(root / "good", tiny_model, seed=2, block_size=K)
    folder = Path(shutil.copytree(good, root / "overflowing"))
    weights = load_file(folder / "model.safetensors")
    weights["fc.weight"] = torch.full_like(weights["fc.weight"], HUGE)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, overflowing: Path
) -> Iterator[Cluster]:
    """A frontend (admin routes on) and an engine started with the overflowing drafter and a spec log, every
    draft verified (adaptive verification, DSpark's default, would verify none of confidence 0)."""
    c = Cluster(tmp_path_factory.mktemp("overflowing-drafter"))
    try:
        c.start_frontend("--admin-api-key", ADMIN_KEY)
        c.start_engine(tiny_model, 0, "--draft-model", str(overflowing), "--no-enable-adaptive-verification",
                       "--spec-log", str(c.log_dir / "spec.jsonl"))  # fmt: skip
        c.wait_healthy()
        yield c
    finally:
        c.stop()


async def complete_all(session: aiohttp.ClientSession, url: str) -> list[str]:
    """Six greedy completions at once; each one's text (every one answered 200)."""

    async def one(i: int) -> str:
        body = {"model": "tiny", "prompt": f"ROMEO {i}: But soft", "max_tokens": 24, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        async with session.post(f"{url}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(60)) as r:
            assert r.status == 200, await r.text()
            return str((await r.json())["choices"][0]["text"])

    return list(await asyncio.gather(*(one(i) for i in range(6))))


async def test_requests_succeed_exactly_and_metrics_equal_the_spec_log(cluster: Cluster) -> None:
    """Drafted with confidence 0 each and verified (no threshold): the texts equal those of the same engine
    once its drafter is unloaded; /metrics equals the spec log bin by bin."""
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as s:
        drafted = await complete_all(s, cluster.url)
        text, logs = await metrics_matching_logs(s, cluster.url, [cluster.log_dir / "spec.jsonl"], K)
        async with s.delete(f"{cluster.url}/admin/engines/0/drafter") as r:
            assert r.status == 200, await r.text()
        assert await complete_all(s, cluster.url) == drafted
    assert not logs.malformed
    metrics = tally_metrics(text)[0]
    assert metrics.bins(K, K + 1) == logs.engines[0].bins(K, K + 1)
    assert metrics.num_drafts > 0 and sum(metrics.confidence_micros_per_pos) == 0
    log = (cluster.log_dir / "engine0.log").read_text()
    assert log.count("produced NaN or infinite values") == 1, log[-3000:]
