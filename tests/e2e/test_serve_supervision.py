"""openinfer-serve as real processes: kill -9 of an engine while requests stream fails only that engine's
requests, the engine is started again and the frontend takes it back; an engine that keeps dying makes the
launcher give up, loudly. kill -9 of the frontend under load: it is started again, the engines keep running,
and with --state-dir every series continues exactly; a restarted frontend that cannot start stops serve."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from openinfer.engine_core.launch.local_cluster import answers_health, python_module
from tests.e2e.load import CYCLE_PROMPT, Load, Scraper, counter_samples, first_tokens, wait_for_first_tokens
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, HOST, Cluster, serve_children


class Serve:
    """``openinfer-serve`` under test; every child pid it was seen with is killed at the end if alive."""

    def __init__(self, log_dir: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.cluster = Cluster(log_dir)
        self.process = self.cluster.start_serve_fake(*flags, env=env)
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

    def wait_serving(self, timeout: float = 90.0) -> None:
        """Until serve announced that it serves (once /health said every engine is up)."""
        deadline = time.monotonic() + timeout
        while "openinfer is serving" not in self.log():
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, f"serve did not announce itself in {timeout} s:\n{self.log()}"
            time.sleep(0.05)

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
        before_first_tokens = await first_tokens(session, url)
        streams = [asyncio.create_task(load.request(session, dict(body))) for _ in range(6)]
        await wait_for_first_tokens(session, url, before_first_tokens + 6)  # every stream has tokens
        before = await engines(session, url)
        running_on_0 = before[0]["load"]["num_running_reqs"]
        old_pid = serve.wait_for("engine0")
        killed = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        outcomes = await asyncio.gather(*streams)
        new_pid = serve.wait_for("engine0", other_than=old_pid)
        async with asyncio.timeout(90):  # bounds the wait for the restarted engine
            while (now := await engines(session, url))[0]["incarnation"] == before[0][
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


def gone(pid: int) -> bool:
    """Process ``pid`` has exited (reaped, or a zombie)."""
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "zombie" in status.read_text()


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


# ---- the frontend ----

K = 4
# A greedy request on the fake model's cycle drafts K tokens a step and keeps them all: K + 1 tokens a step.
LONG_MAX_TOKENS = 1900  # with the 64-token prompt, within the fake model's 2048; >= 380 steps of 50 ms
SPEC_FLAGS = ("--spec-method", "ngram", "--num-spec-tokens", str(K), "--step-sleep", "0.05")


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition`` until it holds (bounded)."""
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.05)


async def long_request(session: aiohttp.ClientSession, url: str, engine_id: asyncio.Future[str]) -> bool:
    """A greedy stream of LONG_MAX_TOKENS tokens; sets ``engine_id`` (the id it runs under on its engine)
    at its first chunk. True if it ended with [DONE], False if its connection broke first."""
    body = {"model": "fake", "prompt": CYCLE_PROMPT, "max_tokens": LONG_MAX_TOKENS, "temperature": 0.0}
    try:
        async with session.post(f"{url}/v1/completions", json={**body, "stream": True}) as r:
            async for line in r.content:
                if line.startswith(b"data: {") and not engine_id.done():
                    engine_id.set_result(json.loads(line[6:])["id"])
                if line.startswith(b"data: [DONE]"):
                    return True
    except aiohttp.ClientError:
        pass
    return False


def logged_tokens(spec_logs: list[Path], request_id: str) -> int:
    """Tokens one request's drafts produced by its spec log lines (each draft: its accepted tokens + 1)."""
    lines = (json.loads(line) for path in spec_logs for line in path.read_text().splitlines())
    return sum(line["num_accepted"] + 1 for line in lines if line["request_id"] == request_id)


async def test_a_killed_frontend_is_restarted_and_every_series_continues(tmp_path: Path) -> None:
    """kill -9 of serve's frontend under load: serve starts it again on the same ports and says so, the
    engines keep running (same pids, no restart counted) and rejoin it; the dead frontend's requests lose
    their connection and are aborted on the engines (no KV left held); with --state-dir no counter goes down
    and openinfer-verify-log finds /metrics equal to the engines' spec logs, bin by bin."""
    flags = ("--engines", "2", *SPEC_FLAGS, "--engine-restart-backoff", "0.2", "--admin-api-key", ADMIN_KEY)
    serve = Serve(tmp_path, *flags, "--spec-log-dir", str(tmp_path), "--state-dir", str(tmp_path / "state"))
    url = serve.cluster.url
    spec_logs = [tmp_path / f"spec-engine{i}.jsonl" for i in range(2)]
    load, scraper = Load(url, clients=6), Scraper(url)
    try:
        serve.wait_serving()
        engine_pids = {role: serve.wait_for(role) for role in ("engine0", "engine1")}
        old_frontend = serve.wait_for("frontend")
        load.start()
        scraper.start()
        async with aiohttp.ClientSession() as session:
            engine_id: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            long = asyncio.create_task(long_request(session, url, engine_id))
            drafts = {e: await engine_counter(session, url, DRAFTS, e) for e in "01"}
            await until(lambda: drafted_since(session, url, drafts), "both engines drafting")
            long_id = await asyncio.wait_for(engine_id, 30)
            await until(lambda: scraped(scraper, 3), "scrapes before the kill")

            killed = time.monotonic()
            os.kill(old_frontend, signal.SIGKILL)
            await asyncio.to_thread(serve.wait_for, "frontend", old_frontend)  # the new one
            await until(lambda: asyncio.to_thread(answers_health, url), "the new frontend answering")
            answered = time.monotonic() - killed
            await asyncio.to_thread(serve.cluster.wait_healthy, 60, 2)
            back = time.monotonic() - killed
            drafts = {e: await engine_counter(session, url, DRAFTS, e) for e in "01"}
            await until(lambda: drafted_since(session, url, drafts), "both engines drafting again")
            scrapes = scraper.scrapes + 3
            await until(lambda: scraped(scraper, scrapes), "scrapes after the restart")
            await load.stop()
            assert not await asyncio.wait_for(long, 30)  # its connection broke with the frontend
            await until(lambda: engines_idle(session, url), "both engines idle with no KV held")
            restarts = [
                await engine_counter(session, url, "openinfer:engine_restarts_total", e) for e in "01"
            ]
        verify = verify_log(url, spec_logs)
        assert serve.process.poll() is None, serve.log()
        assert {role: serve.children()[role] for role in engine_pids} == engine_pids
    finally:
        await load.stop()
        await scraper.stop()
        serve.close()
    assert "OK: /metrics equals the spec logs bin by bin" in verify
    assert not scraper.decreases, scraper.decreases[:5]  # across the restart too: one lifetime
    assert restarts == [0, 0]  # the same incarnations rejoined
    # It ran on for none of its >= 380 steps after the restart: the new frontend aborted it on its engine.
    assert 0 < logged_tokens(spec_logs, long_id) < LONG_MAX_TOKENS - K
    log = serve.log()
    assert "the frontend was killed by SIGKILL; starting it again in 0.2 s" in log
    assert f"the frontend is listening on {url} again" in log
    assert not load.of_kind("timeout") and not load.of_kind("engine_error"), load.outcomes
    down = (killed - 0.5, killed + back + 1.0)  # connection errors and 503s (no engine yet) only then
    for outcome in load.of_kind("connection") + load.of_kind("http"):
        assert down[0] <= outcome.ended <= down[1] and outcome.status in (0, 503), outcome
    print(f"frontend answering /health {answered:.1f} s after kill -9, both engines back {back:.1f} s after")


DRAFTS = "vllm:spec_decode_num_drafts_total"


async def drafted_since(session: aiohttp.ClientSession, url: str, drafts: dict[str, float]) -> bool:
    """Both engines drafted since ``drafts`` were read (False while the frontend does not answer)."""
    try:
        now = {e: await engine_counter(session, url, DRAFTS, e) for e in drafts}
    except aiohttp.ClientError:
        return False
    return all(now[e] > drafts[e] for e in drafts)


async def scraped(scraper: Scraper, count: int) -> bool:
    return scraper.scrapes >= count


async def engines_idle(session: aiohttp.ClientSession, url: str, count: int = 2) -> bool:
    """``count`` engines' latest snapshots at the frontend: nothing running or waiting, no KV block held."""
    loads = [e["load"] for e in (await engines(session, url)).values()]
    return len(loads) == count and all(
        (load["num_running_reqs"], load["num_waiting_reqs"], load["kv_used_blocks"]) == (0, 0, 0)
        for load in loads
    )


def test_a_restarted_frontend_that_cannot_start_stops_serve(tmp_path: Path) -> None:
    """kill -9 of the frontend while another process took its HTTP port: the restarted frontend exits
    before it answers /health, so serve does not start it again but stops everything, saying why (exit 1)."""
    serve = Serve(tmp_path, "--engine-restart-backoff", "0.1")
    squatter = socket.socket()
    try:
        serve.wait_serving()
        frontend, engine = serve.wait_for("frontend"), serve.wait_for("engine0")
        os.kill(serve.process.pid, signal.SIGSTOP)  # so that the port is taken before the restart
        wait_for_state(serve.process.pid, "T")
        os.kill(frontend, signal.SIGKILL)
        wait_for_state(frontend, "Z")  # not reaped: serve is stopped
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((HOST, serve.cluster.http_port))
        squatter.listen()
        os.kill(serve.process.pid, signal.SIGCONT)
        assert serve.process.wait(60) == 1
        log = serve.log()
        assert "the frontend was killed by SIGKILL; starting it again in 0.1 s" in log
        assert "openinfer-frontend could not start: " in log
        assert (
            f"the frontend exited with code 1 before listening on {serve.cluster.url}: it cannot start as "
            "configured (its log says why); stopping everything"
        ) in log
        assert log.count("the frontend started again") == 1
        status = Path(f"/proc/{engine}/status")
        assert not status.exists() or "zombie" in status.read_text()
    finally:
        squatter.close()
        serve.close()


async def test_a_frontend_killed_before_any_periodic_save_loses_nothing(tmp_path: Path) -> None:
    """--state-interval 60, so only a join (and a scrape, of which there is none before the kill) saves the
    state: a frontend SIGKILLed after its engine joined and drafted, restarted by serve, still counts every
    draft of that engine (the join saved its baseline; a restarted frontend without it would take the
    engine's next snapshot as its baseline and lose the drafts before it)."""
    flags = (*SPEC_FLAGS, "--engine-restart-backoff", "0.2", "--admin-api-key", ADMIN_KEY)
    state_flags = ("--spec-log-dir", str(tmp_path), "--state-dir", str(tmp_path / "state"))
    serve = Serve(tmp_path, *flags, *state_flags, "--state-interval", "60")
    url, spec_log = serve.cluster.url, tmp_path / "spec-engine0.jsonl"
    load = Load(url, clients=2)
    try:
        await asyncio.to_thread(serve.wait_serving)  # it asked /health and /v1/models: neither saves
        old_frontend = serve.wait_for("frontend")
        async with aiohttp.ClientSession() as session:
            load.start()
            await until(lambda: drafted(spec_log), "drafts in the spec log")
            os.kill(old_frontend, signal.SIGKILL)
            await load.stop()  # its requests in flight lose their connection; the engine goes on with them
            await asyncio.to_thread(serve.wait_for, "frontend", old_frontend)
            await asyncio.to_thread(serve.cluster.wait_healthy, 60)
            await until(lambda: engines_idle(session, url, 1), "engine 0 idle")
        assert "OK: /metrics equals the spec logs bin by bin" in verify_log(url, [spec_log])
    finally:
        await load.stop()
        serve.close()


def verify_log(url: str, spec_logs: list[Path]) -> str:
    """What ``openinfer-verify-log`` prints comparing the frontend's /metrics with these spec logs."""
    argv = ["--metrics-url", f"{url}/metrics", "--spec-log", *map(str, spec_logs)]
    done = subprocess.run(
        [sys.executable, "-m", "openinfer.tools.verify_log", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout + done.stderr


async def drafted(spec_log: Path) -> bool:
    return spec_log.exists() and spec_log.stat().st_size > 0


def wait_for_state(pid: int, state: str) -> None:
    """Until process ``pid`` is in ``state`` (``T``: stopped; ``Z``: dead, every thread of it gone, so its
    sockets are closed: its first thread is a zombie while the others may still be exiting). Bounded: 10 s."""
    deadline = time.monotonic() + 10
    while True:
        now = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if now == state and (state != "Z" or os.listdir(f"/proc/{pid}/task") == [str(pid)]):
            return
        assert time.monotonic() < deadline, f"process {pid} is in state {now}, not {state}"
        time.sleep(0.01)
