"""Real processes: --fake-model engines serve and slow down on demand, and an engine's SIGKILL reaches its
clients as a clear error on its closed connection, while its other requests move to the live engine."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import aiohttp
import pytest

from openinfer.engine_core.worker.fake_model_runner import FAKE_CYCLE, FIRST_CYCLE_TOKEN
from tests.e2e.load import Load, first_tokens, wait_for_first_tokens
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster


@pytest.fixture(scope="module")
def fake_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A frontend (30 s timeout: only the closed connection can be what notices a death fast) and two
    slowed fake engines with n-gram speculation."""
    c = Cluster(tmp_path_factory.mktemp("death"))
    try:
        c.start_frontend("--engine-timeout", "30", "--admin-api-key", ADMIN_KEY)
        for index in (0, 1):
            c.start_fake_engine(
                index, "--step-sleep", "0.05", "--spec-method", "ngram", "--num-spec-tokens", "3"
            )
        c.wait_healthy(engines=2)
        yield c
    finally:
        c.stop()


async def test_fake_engine_streams_its_cycle_with_speculation(fake_cluster: Cluster) -> None:
    """Greedy output is the fake model's cycle; drafts are accepted, so fewer steps than tokens."""
    body = {"model": "fake", "prompt": [3, 4, 5], "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    body["return_token_ids"] = True
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{fake_cluster.url}/v1/completions", json=body) as r:
            result = await r.json()
        async with s.get(f"{fake_cluster.url}/metrics") as r:
            metrics = await r.text()
    tokens = result["choices"][0]["token_ids"]
    assert tokens == [FIRST_CYCLE_TOKEN + (6 - FIRST_CYCLE_TOKEN + i) % FAKE_CYCLE for i in range(40)]
    steps = result["metrics"]["speculative_decoding"]["num_spec_steps"] + 1  # drafts, plus the prefill
    assert steps < 40  # speculation saved steps
    assert "vllm:spec_decode_num_accepted_tokens_total" in metrics


async def test_killed_engine_fails_its_requests_in_about_a_second(fake_cluster: Cluster) -> None:
    """(Runs last: it kills engine 0.) SIGKILL engine 0 with streams running on both engines: engine 0's
    clients get an error naming it and its closed connection (not the 30 s silence timeout: every stream
    ends inside a bounded wait shorter than it), engine 1's finish, nothing hangs."""
    load = Load(fake_cluster.url, clients=0)
    body = {"model": "fake", "prompt": "Hi", "max_tokens": 200, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        before = await first_tokens(session, fake_cluster.url)
        streams = [asyncio.create_task(load.request(session, dict(body))) for _ in range(6)]
        # Every stream has its first token: none of engine 0's can move to engine 1.
        await wait_for_first_tokens(session, fake_cluster.url, before + 6)
        fake_cluster.kill("engine0", signal.SIGKILL)
        outcomes = await asyncio.wait_for(asyncio.gather(*streams), timeout=20.0)
    failed = [o for o in outcomes if o.kind == "engine_error"]
    assert len(failed) == 3 and all(o.kind in ("ok", "engine_error") for o in outcomes)
    for outcome in failed:
        assert "engine 0" in outcome.message and "connection closed" in outcome.message
        assert "sent nothing" not in outcome.message  # the close's probe ended it, not the silence timeout
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{fake_cluster.url}/admin/engines", headers=ADMIN_HEADERS) as r:
            up = {e["index"]: e["up"] for e in (await r.json())["engines"]}
    assert up == {0: False, 1: True}
