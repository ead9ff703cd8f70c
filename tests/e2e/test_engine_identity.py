"""Real processes: engine identity is not first come, last served. A second `openinfer-engine --engine-index 0`
while engine 0 is alive is refused (it exits 3, both sides log why) and every completion still comes from
the first; once the first is killed, a new engine 0 is taken back at once, long before the timeout."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator

import aiohttp
import pytest

from openinfer.engine_core.launch.local_cluster import python_module
from tests.e2e.load import counter_samples
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster

ENGINE_TIMEOUT_S = 30.0  # so long that only the closed connection can be what gives the index back


@pytest.fixture(scope="module")
def identity_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A frontend and one fake engine 0."""
    c = Cluster(tmp_path_factory.mktemp("identity"))
    try:
        c.start_frontend("--engine-timeout", str(ENGINE_TIMEOUT_S), "--admin-api-key", ADMIN_KEY)
        c.start_fake_engine(0)
        c.wait_healthy()
        yield c
    finally:
        c.stop()


def engine_0(c: Cluster) -> tuple[str, bool]:
    """(incarnation, up) of engine 0, from the admin API."""
    request = urllib.request.Request(f"{c.url}/admin/engines", headers=ADMIN_HEADERS)
    with urllib.request.urlopen(request, timeout=5) as r:
        [engine] = json.load(r)["engines"]
    return str(engine["incarnation"]), bool(engine["up"])


def incarnation(c: Cluster) -> str:
    """Engine 0's incarnation, which must be up."""
    name, up = engine_0(c)
    assert up
    return name


def counter(c: Cluster, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"{c.url}/metrics", timeout=5) as r:
        samples = counter_samples(r.read().decode())
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def completions(c: Cluster, count: int) -> list[int]:
    """Statuses of ``count`` completions of model "fake"."""
    body = {"model": "fake", "prompt": "Hello", "max_tokens": 4}
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(f"{c.url}/v1/completions", json=body) as r:
                return r.status

        return await asyncio.gather(*(one() for _ in range(count)))


async def test_a_second_engine_0_is_refused_while_the_first_lives(identity_cluster: Cluster) -> None:
    """The stranger (serving "stranger") gets HelloRefused, logs it and exits 3; the frontend logs and counts
    the refusal; /v1/models never shows "stranger"; completions are all served by the first engine 0."""
    c = identity_cluster
    first = incarnation(c)
    argv = python_module(
        "openinfer.engine_core.process.engine_cli",
        *("--device", "cpu", "--engine-index", "0", "--frontend", c.engine_address, "--fake-model"),
        *("--served-model-name", "stranger", "--num-kv-blocks", "256"),
    )
    stranger = c.spawn("stranger", argv)
    statuses = await completions(c, 8)  # while it starts and says hello
    assert await asyncio.to_thread(stranger.wait, 120) == 3
    del c.processes["stranger"]  # it exited (reaped): the cluster's liveness checks are about the others
    assert statuses == [200] * 8 and await completions(c, 8) == [200] * 8
    stranger_log = (c.log_dir / "stranger.log").read_text()
    assert "the frontend refused this engine, which stops" in stranger_log
    assert "engine index 0 is held by a live engine" in stranger_log
    assert "refused a hello from engine 0" in (c.log_dir / "frontend.log").read_text()
    assert counter(c, "openinfer:engine_hellos_refused_total", engine="0", reason="engine_alive") == 1
    assert counter(c, "openinfer:engine_restarts_total", engine="0") == 0
    assert incarnation(c) == first
    with urllib.request.urlopen(f"{c.url}/v1/models", timeout=5) as r:
        assert [model["id"] for model in json.load(r)["data"]] == ["fake"]
    # Its requests all went to the first engine: the engine counts what it served (16 requests' prompts).
    assert (
        counter(c, "vllm:request_success_total", model_name="fake", engine="0", finished_reason="length")
        == 16
    )


async def test_a_killed_engine_is_replaced_at_once(identity_cluster: Cluster) -> None:
    """(Runs last: it kills engine 0.) SIGKILL engine 0 and start another: it is serving well before the 30 s
    timeout could have freed the index (its start-up is most of the wait), counted as a restart, not refused."""
    c = identity_cluster
    first = incarnation(c)
    c.kill("engine0")
    c.start_fake_engine(0)
    async with asyncio.timeout(ENGINE_TIMEOUT_S):  # the wait the timeout would take to free the index
        while engine_0(c)[0] == first:  # the old one, up or (about a second after the kill) down
            c.check_alive()
            await asyncio.sleep(0.1)
    assert engine_0(c)[1] and (c.log_dir / "engine0.log").read_text().count("refused") == 0
    assert counter(c, "openinfer:engine_restarts_total", engine="0") == 1
    assert counter(c, "openinfer:engine_hellos_refused_total", engine="0", reason="engine_alive") == 1
    assert await completions(c, 4) == [200] * 4
