"""Issue 39's attacks on ``openinfer-serve``'s processes and port: a second serve on its HTTP port, and an api
server killed under load (run the server with ``--api-server-count 2``; with one api server the second kills
its frontend, which nothing can stand in for)."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path

import aiohttp

from openinfer.benchmarks.attack_target import Target, tally
from openinfer.engine_core.launch.local_cluster import free_port_pair, python_module, serve_children

IMPOSTOR = "IMPOSTOR"
MODEL_CALLS = 40  # /v1/models calls, each on a new connection, asked once the impostor is up
IMPOSTOR_START_S = 15.0  # how long the impostor gets to start: a fake-model serve is up in a few seconds
RESTART_WAIT_S = 60.0  # how long serve gets to start the killed api server again
CLIENTS = 4  # concurrent clients of the load through the kill


def _gone(pid: int) -> bool:
    """Process ``pid`` has exited (reaped, or a zombie)."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


async def _model_ids(target: Target) -> list[str]:
    """The ids /v1/models lists, asked on a new connection; [] when it does not answer 200."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    connector = aiohttp.TCPConnector(force_close=True)
    try:
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
            async with session.get(f"{target.url}/v1/models") as response:
                if response.status != 200:
                    return []
                return [model["id"] for model in (await response.json())["data"]]
    except aiohttp.ClientError:
        return []


async def port_impostor(target: Target) -> str:
    """A second ``openinfer-serve --api-server-count 2`` on the target's HTTP port (engine ports of its own,
    fake engines named IMPOSTOR): whether it exits, and how, within IMPOSTOR_START_S; if it runs, how many of
    MODEL_CALLS /v1/models calls it answers. It is stopped by pid whatever happens."""
    flags = ["--host", target.host, "--port", str(target.port), "--engine-port", str(free_port_pair(2))]
    flags += ["--api-server-count", "2", "--fake-model", "--served-model-name", IMPOSTOR]
    argv = python_module("openinfer.engine_core.launch.serve", *flags)
    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        impostor = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
        try:
            code = await asyncio.wait_for(impostor.wait(), IMPOSTOR_START_S)
        except TimeoutError:
            answers = [await _model_ids(target) for _ in range(MODEL_CALLS)]
            taken = sum(IMPOSTOR in ids for ids in answers)
            return f"the impostor serve runs: it answered {taken} of {MODEL_CALLS} /v1/models calls"
        finally:
            if impostor.returncode is None:
                impostor.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(impostor.wait(), 30)
                except TimeoutError:
                    impostor.kill()
                    await impostor.wait()
        log.seek(0)
        said = log.read().decode(errors="replace").strip().splitlines()
    last = said[-1].split(" ERROR ", 1)[-1] if said else "nothing"
    return f"the impostor serve exited with {code} after {time.monotonic() - started:.1f} s: {last}"


async def _completions(target: Target, sent: list[tuple[float, int]], stop: asyncio.Event) -> None:
    """2-token completions one after the other, each on a new connection, until ``stop``: (sent at, status;
    0 without an answer)."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    connector = aiohttp.TCPConnector(force_close=True)  # a connection per request: any api server may take it
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as session:
        while not stop.is_set():
            started = time.monotonic()
            try:
                async with session.post(f"{target.url}/v1/completions", json=target.body()) as response:
                    await response.read()
                    sent.append((started, response.status))
            except (aiohttp.ClientError, TimeoutError):
                sent.append((started, 0))


async def api_server_restart(target: Target) -> str:
    """kill -9 of api server 1 (the frontend with one api server) under CLIENTS clients sending 2-token
    completions, each on a new connection: the statuses of the requests sent once it was dead, until serve
    started it again and ``seconds`` more passed."""
    children = serve_children(target.serve_pid)
    role = "api-server1" if "api-server1" in children else "frontend"
    if role not in children:
        return f"openinfer-serve (pid {target.serve_pid}) runs no {role}"
    sent: list[tuple[float, int]] = []
    stop = asyncio.Event()
    clients = [asyncio.create_task(_completions(target, sent, stop)) for _ in range(CLIENTS)]
    try:
        while len(sent) < 2 * CLIENTS and not any(client.done() for client in clients):
            await asyncio.sleep(0.05)  # load before the kill
        killed = children[role]
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + RESTART_WAIT_S
        while not _gone(killed) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        dead = time.monotonic()
        while serve_children(target.serve_pid).get(role) in (None, killed) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        back = time.monotonic() - dead
        restarted = serve_children(target.serve_pid).get(role) not in (None, killed)
        await asyncio.sleep(target.seconds)  # the load goes on through the restarted one's first seconds
    finally:
        stop.set()
        await asyncio.gather(*clients)
    after = [status for started, status in sent if started >= dead]
    again = f"started again {back:.1f} s after its death" if restarted else "not started again"
    return f"kill -9 of {role}, {again}; requests sent after its death: {tally(after) or 'none'}"
