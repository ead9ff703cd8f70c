"""The built-in pair served for real: with its DFlash drafter the frontend answers exactly the tokens of an
engine without speculation, and /metrics equals the drafting engine's spec log, bin by bin; a drafter loaded
at run time without a folder is the built-in one of its method."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from openinfer.engine_core.builtin_model import (
    BUILTIN_NUM_SPEC_TOKENS,
    builtin_drafter_folder,
    builtin_target_folder,
)
from openinfer.tools.spec_tally import tally_metrics
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster
from tests.e2e.settled_metrics import metrics_matching_logs

K = BUILTIN_NUM_SPEC_TOKENS
PROMPTS = [
    "ROMEO:",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "KING RICHARD III:\nNow is the winter of our discontent",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
]


@pytest.fixture(scope="module")
def pair_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One frontend; engine 0 serves the built-in target alone as "plain", engine 1 with the built-in
    DFlash drafter (K=7) as "dflash", writing a spec log."""
    c = Cluster(tmp_path_factory.mktemp("builtin"))
    try:
        c.start_frontend("--spec-log-interval", "1", "--admin-api-key", ADMIN_KEY)
        c.start_engine(builtin_target_folder(), 0, "--served-model-name", "plain")
        c.start_engine(
            builtin_target_folder(),
            1,
            "--served-model-name",
            "dflash",
            "--spec-method",
            "dflash",
            "--num-spec-tokens",
            str(K),
            "--draft-model",
            str(builtin_drafter_folder()),
            "--spec-log",
            str(c.log_dir / "spec1.jsonl"),
        )
        c.wait_healthy(engines=2)
        yield c
    finally:
        c.stop()


async def token_ids(session: aiohttp.ClientSession, url: str, model: str, prompt: str) -> list[int]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    async with session.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["choices"][0]["token_ids"]


async def test_dflash_tokens_equal_plain_and_metrics_equal_logs(pair_cluster: Cluster) -> None:
    """Temperature 0, concurrent requests: the "dflash" model's tokens are the "plain" model's; the
    drafts were often accepted; /metrics for engine 1 equals its spec log exactly."""
    url = pair_cluster.url
    async with aiohttp.ClientSession() as s:
        plain, drafted = await asyncio.gather(
            asyncio.gather(*(token_ids(s, url, "plain", p) for p in PROMPTS)),
            asyncio.gather(*(token_ids(s, url, "dflash", p) for p in PROMPTS)),
        )
        text, logs = await metrics_matching_logs(s, url, [pair_cluster.log_dir / "spec1.jsonl"], K)
    assert drafted == plain
    assert not logs.malformed and set(logs.engines) == {1}
    assert tally_metrics(text)[1].bins(K, K + 1) == logs.engines[1].bins(K, K + 1)
    tally = logs.engines[1]
    assert tally.num_accepted_tokens >= 2.0 * tally.num_drafts  # a trained drafter: real acceptance


@pytest.mark.parametrize(
    ("method", "loaded"),
    [("dspark", "loaded dspark K=7 block=7 (markov="), ("dflash", "loaded dflash K=7 block=8 (anchor_slot)")],
)
async def test_a_drafter_loaded_without_a_folder_is_the_builtin_one(
    pair_cluster: Cluster, method: str, loaded: str
) -> None:
    """Admin API on engine 0, which serves the built-in target by its folder (as openinfer-serve names it):
    dspark or dflash with no `draft_model` loads the built-in drafter of that method (DSpark's 7-slot block
    with its heads, the z-lab-layout DFlash's 8 slots); the engine's tokens stay the target's; unloaded after."""
    url = pair_cluster.url
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as s:
        plain = await token_ids(s, url, "plain", PROMPTS[1])
        body = {"method": method, "num_spec_tokens": K}
        async with s.post(f"{url}/admin/engines/0/drafter", json=body) as r:
            status, answer = r.status, await r.json()
        drafted = await token_ids(s, url, "plain", PROMPTS[1])
        async with s.delete(f"{url}/admin/engines/0/drafter") as r:
            assert r.status == 200, await r.text()
    assert status == 200 and answer["num_spec_tokens"] == K, answer
    assert answer["message"].startswith(loaded), answer
    assert drafted == plain
