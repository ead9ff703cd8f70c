"""openinfer-serve as real processes: kill -9 of an engine while requests stream fails only that engine's
requests, the engine is started again and the frontend takes it back; an engine that keeps dying makes the
launcher give up, loudly."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.load import Load, counter_samples
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster, serve_children


class Serve:
    """``openinfer-serve`` under test; every child pid it was seen with is killed at the end if alive."""

    def __init__(self, log_dir: Path, *flags: str) -> None:
        self.cluster = Cluster(log_dir)
        self.process = self.cluster.start_serve_fake(*flags)
        self.seen: set[int] = set()

    def children(self) -> dict[str, int]:
        roles = serve_children(self.process.pid)
        self.seen |= set(roles.values())
        return roles

    def wait_for(self, role: str, other_than: int | None = None, timeout: float = 90.0) -> int:
        """The pid of ``role`` once it runs (and is not ``other_than``)."""
        deadline = time.monotonic() + timeout
        while (pid := self.children().get(role)) is None or pid == other_than:
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, f"no {role} after {timeout} s:\n{self.log()}"
            time.sleep(0.05)
        return pid

    def log(self) -> str:
        return (self.cluster.log_dir / "serve.log").read_text(errors="replace")  # type: ignore[operator]

    def close(self) -> None:
        self.cluster.stop(30)
        for pid in self.seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


async def engines(session: aiohttp.ClientSession, url: str) -> dict[int, dict]:  # type: ignore[type-arg]
    async with session.get(f"{url}/admin/engines", headers=ADMIN_HEADERS) as r:
        return {e["index"]: e for e in (await r.json())["engines"]}


async def engine_counter(session: aiohttp.ClientSession, url: str, name: str, engine: str) -> float:
    async with session.get(f"{url}/metrics") as r:
        samples = counter_samples(await r.text())
    return sum(v for (n, labels), v in samples.items() if n == name and ("engine", engine) in labels)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Two slowed fake engines (50 ms a step, no speculation: a 200-token stream takes 10 s), restarted
    0.2 s after a death."""
    flags = ("--engines", "2", "--step-sleep", "0.05", "--engine-restart-backoff", "0.2")
    under_test = Serve(tmp_path, *flags, "--admin-api-key", ADMIN_KEY)  # the frontend gets it in its env
    try:
        under_test.cluster.wait_healthy(90, engines=2)
        yield under_test
    finally:
        under_test.close()


async def test_a_killed_engine_is_restarted_and_only_its_requests_fail(serve: Serve) -> None:
    """kill -9 of engine 0 with six streams on the two engines: exactly the streams engine 0 was running
    end with an error naming it, engine 1's finish; serve keeps running, starts engine 0 again, the
    frontend takes the new incarnation back (counted as a restart) and it serves requests."""
    url = serve.cluster.url
    load = Load(url, clients=0)
    body = {"model": "fake", "prompt": "Hi", "max_tokens": 200, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        streams = [asyncio.create_task(load.request(session, dict(body))) for _ in range(6)]
        await asyncio.sleep(2.0)  # every stream has tokens
        before = await engines(session, url)
        running_on_0 = before[0]["load"]["num_running_reqs"]
        old_pid = serve.wait_for("engine0")
        killed = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        outcomes = await asyncio.gather(*streams)
        new_pid = serve.wait_for("engine0", other_than=old_pid)
        while (now := await engines(session, url))[0]["incarnation"] == before[0]["incarnation"] or not now[
            0
        ]["up"]:
            assert time.monotonic() - killed < 90, serve.log()
            await asyncio.sleep(0.05)
        back = time.monotonic() - killed
        tokens_before = await engine_counter(session, url, "vllm:generation_tokens_total", "0")
        short = {**body, "max_tokens": 8}
        done = await asyncio.gather(*(load.request(session, dict(short)) for _ in range(4)))
        served = await engine_counter(session, url, "vllm:generation_tokens_total", "0") - tokens_before
        restarts = await engine_counter(session, url, "openinfer:engine_restarts_total", "0")
    failed = [o for o in outcomes if o.kind != "ok"]
    assert running_on_0 >= 1 and len(failed) == running_on_0, outcomes
    assert all(o.kind == "engine_error" and "engine 0" in o.message for o in failed)
    assert [o.kind for o in done] == ["ok"] * 4
    assert served > 0 and restarts == 1  # the new incarnation generated tokens; one restart counted
    assert serve.process.poll() is None and new_pid != old_pid
    assert "engine 0 was killed by SIGKILL; starting it again in 0.2 s" in serve.log()
    print(f"engine 0 back (new incarnation up at the frontend) {back:.1f} s after kill -9")


def test_an_engine_that_keeps_dying_makes_serve_give_up(tmp_path: Path) -> None:
    """--engine-restart-limit 1: the first kill -9 is restarted, the second within the minute stops
    everything with an error naming the limit and exit code 1, and no child outlives serve."""
    serve = Serve(tmp_path, "--engine-restart-limit", "1", "--engine-restart-backoff", "0.1")
    try:
        serve.cluster.wait_healthy(90)
        first = serve.wait_for("engine0")
        frontend = serve.wait_for("frontend")
        os.kill(first, signal.SIGKILL)
        second = serve.wait_for("engine0", other_than=first)
        os.kill(second, signal.SIGKILL)
        assert serve.process.wait(60) == 1
        log = serve.log()
        assert "engine 0 was killed by SIGKILL; starting it again in 0.1 s" in log
        assert (
            "engine 0 was killed by SIGKILL, after 1 restart(s) in the last 60 s (--engine-restart-limit); "
            "giving up and stopping everything"
        ) in log
        for pid in (frontend, second):
            status = Path(f"/proc/{pid}/status")
            assert not status.exists() or "zombie" in status.read_text()
    finally:
        serve.close()


def test_a_killed_serve_leaves_no_child_behind(tmp_path: Path) -> None:
    """kill -9 of serve itself (it cannot stop its children): they are told to stop as their parent dies,
    so no frontend or engine keeps serving or holding the ports."""
    serve = Serve(tmp_path, "--engines", "2")
    try:
        serve.cluster.wait_healthy(90, engines=2)
        children = [serve.wait_for(role) for role in ("frontend", "engine0", "engine1")]
        os.kill(serve.process.pid, signal.SIGKILL)
        serve.process.wait(10)
        deadline = time.monotonic() + 30
        alive = children
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [pid for pid in alive if Path(f"/proc/{pid}").exists()]
        assert not alive, f"children {alive} outlived a kill -9 of serve"
    finally:
        serve.close()
