"""openinfer-serve restarting its frontend, as real processes: kill -9 of the frontend under load: it is started
again, the engines keep running, and with --state-dir every series continues exactly (even killed before any
periodic save); a restarted frontend that cannot start stops serve."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from openinfer.engine_core.launch.local_cluster import answers_health
from tests.e2e.frontend_reads import engine_counter, engines_idle, until
from tests.e2e.load import CYCLE_PROMPT, Load, Scraper
from tests.e2e.processes import ADMIN_KEY, HOST
from tests.e2e.serve_under_test import Serve, wait_for_state

K = 4
# A greedy request on the fake model's cycle drafts K tokens a step and keeps them all: K + 1 tokens a step.
LONG_MAX_TOKENS = 1900  # with the 64-token prompt, within the fake model's 2048; >= 380 steps of 50 ms
SPEC_FLAGS = ("--spec-method", "ngram", "--num-spec-tokens", str(K), "--step-sleep", "0.05")


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


def test_a_restarted_frontend_that_cannot_start_stops_serve(tmp_path: Path) -> None:
    """kill -9 of the frontend while another process took its engine port (not its HTTP port: serve holds
    that one, see test_shared_port.py): the restarted frontend exits before it got ready, so serve does not
    start it again but stops everything, saying why (exit 1)."""
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
        squatter.bind((HOST, serve.cluster.engine_port))
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
