"""openinfer-serve supervising its engines, as real processes: kill -9 of an engine while requests stream fails
only that engine's requests, the engine is started again and the frontend takes it back; an engine that keeps
dying makes the launcher give up, loudly; signals stop serve and everything it started (its frontend's
restarts: test_frontend_restart.py)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from openinfer.engine_core.launch.local_cluster import python_module
from tests.e2e.frontend_reads import admin_engines, engine_counter
from tests.e2e.load import Load, first_tokens, wait_for_first_tokens
from tests.e2e.processes import ADMIN_KEY, HOST, Cluster
from tests.e2e.serve_under_test import Serve, gone


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
        before_first_tokens = await first_tokens(session, url)
        streams = [asyncio.create_task(load.request(session, dict(body))) for _ in range(6)]
        await wait_for_first_tokens(session, url, before_first_tokens + 6)  # every stream has tokens
        before = await admin_engines(session, url)
        running_on_0 = before[0]["load"]["num_running_reqs"]
        old_pid = serve.wait_for("engine0")
        killed = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        outcomes = await asyncio.gather(*streams)
        new_pid = serve.wait_for("engine0", other_than=old_pid)
        async with asyncio.timeout(90):  # bounds the wait for the restarted engine
            while (now := await admin_engines(session, url))[0]["incarnation"] == before[0][
                "incarnation"
            ] or not now[0]["up"]:
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


def private_key_folders(tmp_dir: Path) -> list[Path]:
    """The CurveZMQ key folders serve made in ``tmp_dir`` (its $TMPDIR) that are still there."""
    return list(tmp_dir.glob("openinfer-keys-*"))


def test_serve_stops_on_sighup_and_removes_its_keys(tmp_path: Path) -> None:
    """SIGHUP (a closed terminal) stops serve as SIGTERM does: exit 0, its children stopped and the private
    key folder it made removed, not left in the temporary folder."""
    tmp_dir = tmp_path / "tmp"
    tmp_dir.mkdir()
    serve = Serve(tmp_path, env={"TMPDIR": str(tmp_dir)})
    try:
        serve.wait_serving()
        children = [serve.wait_for(role) for role in ("frontend", "engine0")]
        assert len(private_key_folders(tmp_dir)) == 1
        os.kill(serve.process.pid, signal.SIGHUP)
        assert serve.process.wait(60) == 0, serve.log()
        assert "openinfer stopped" in serve.log()
        assert private_key_folders(tmp_dir) == [] and all(map(gone, children))
    finally:
        serve.close()


MASKS = ("SigIgn", "SigCgt")  # /proc/PID/status: the signals a process ignores, and those it catches


def test_under_nohup_sighup_stays_ignored(tmp_path: Path) -> None:
    """Started by nohup (SIGHUP ignored), serve leaves SIGHUP ignored, so it outlives its terminal as asked
    (without nohup it catches SIGHUP, to stop); SIGTERM still stops it."""
    cluster = Cluster(tmp_path)
    ports = ["--host", HOST, "--port", str(cluster.http_port), "--engine-port", str(cluster.engine_port)]
    serve = python_module(
        "openinfer.engine_core.launch.serve", *ports, "--fake-model", "--served-model-name", "fake"
    )
    process = cluster.spawn("serve", ["nohup", *serve])  # nohup execs serve: the same pid
    try:
        cluster.wait_healthy(90)
        status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
        masks = {line.split(":")[0]: int(line.split()[1], 16) for line in status if line[:6] in MASKS}
        sighup = 1 << (signal.SIGHUP - 1)
        assert (masks["SigIgn"] & sighup, masks["SigCgt"] & sighup) == (sighup, 0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        cluster.stop(30)


def test_an_engine_that_cannot_be_started_stops_serve_and_leaves_nothing(tmp_path: Path) -> None:
    """Engine 0's process cannot be made (its command line is longer than the kernel takes: exec fails with
    E2BIG) after the frontend was started: serve says which child and why, exit 1, the frontend it started
    is stopped and the private key folder removed."""
    tmp_dir = tmp_path / "tmp"
    tmp_dir.mkdir()
    # Linux takes one argument of at most 32 pages (MAX_ARG_STRLEN, with its NUL): serve's --spec-log-dir
    # value fits, engine 0's --spec-log=DIR/spec-engine0.jsonl, 30 bytes longer, does not.
    spec_log_dir = "/" + "d" * (32 * os.sysconf("SC_PAGE_SIZE") - 12)
    serve = Serve(tmp_path, "--spec-log-dir", spec_log_dir, env={"TMPDIR": str(tmp_dir)})
    try:
        assert serve.process.wait(60) == 1, serve.log()
        log = serve.log()
        assert (
            "openinfer did not start: engine 0 could not be started ([Errno 7] Argument list too long" in log
        )
        frontend = re.search(r"the frontend started \(pid (\d+)\)", log)
        assert frontend is not None and gone(int(frontend[1]))
        assert private_key_folders(tmp_dir) == [] and "openinfer stopped" in log
    finally:
        serve.close()
