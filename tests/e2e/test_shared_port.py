"""The HTTP port of ``openinfer-serve --api-server-count 2``, with real processes: only this serve's api
servers take its connections (a second serve on the port exits at once, saying the port is in use), and an
api server that serve restarts takes none before an engine joined it, so every request through its restart
is served by the api servers that can serve it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from openinfer.engine_core.launch.local_cluster import python_module
from openinfer.frontend.metrics.api_servers import ApiServerView
from tests.e2e.frontend_reads import until, wait
from tests.e2e.processes import HOST, cmdline, free_port_pair
from tests.e2e.serve_under_test import Serve, gone


def model_ids(url: str) -> list[str]:
    """The ids on /v1/models, asked on a connection of its own (urllib keeps none)."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as r:
        return [model["id"] for model in msgspec.json.decode(r.read())["data"]]


def test_a_second_serve_on_the_port_exits_and_the_first_keeps_it(tmp_path: Path) -> None:
    """A second ``openinfer-serve --api-server-count 2`` on the first's HTTP port (engine ports of its own,
    another model name) exits with status 1, saying the port is in use; the first serve's api servers still
    answer each of 40 /v1/models calls, each on a new connection, with their model alone."""
    serve = Serve(tmp_path, "--api-server-count", "2", api_servers=2)
    try:
        serve.wait_serving()
        port = serve.cluster.http_port
        ports = ["--host", HOST, "--port", str(port), "--engine-port", str(free_port_pair(2))]
        impostor = ["--api-server-count", "2", "--fake-model", "--served-model-name", "IMPOSTOR"]
        argv = python_module("openinfer.engine_core.launch.serve", *ports, *impostor)
        second = serve.cluster.spawn("second-serve", argv)
        assert second.wait(60) == 1  # bounded: a serve that started would run until stopped
        log = (tmp_path / "second-serve.log").read_text()
        assert f"openinfer did not start: port {port} is in use on {HOST}" in log, log
        assert [model_ids(serve.cluster.url) for _ in range(40)] == [["fake"]] * 40
    finally:
        serve.close()


@dataclass(frozen=True)
class Answer:
    """One completion of the load: when it was sent, and its status (0: no answer) and error, if any."""

    started: float
    status: int
    error: str = ""


async def completions(url: str, answers: list[Answer], stop: asyncio.Event) -> None:
    """Short completions one after the other, each on a new connection to ``url``, until ``stop``."""
    body = {"model": "fake", "prompt": "Hi", "max_tokens": 4, "ignore_eos": True}
    connector = aiohttp.TCPConnector(force_close=True)  # a connection per request: any api server may take it
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not stop.is_set():
            started = time.monotonic()
            try:
                async with session.post(f"{url}/v1/completions", json=body) as r:
                    text = await r.text()
                    answers.append(Answer(started, r.status, "" if r.status == 200 else text))
            except (aiohttp.ClientError, TimeoutError) as e:
                answers.append(Answer(started, 0, f"{type(e).__name__}: {e}"))


async def requests_served(peers: Path, index: int) -> float | None:
    """``vllm:request_success_total`` in api server ``index``'s own view, asked on its Unix socket; None
    while it does not answer there."""
    connector = aiohttp.UnixConnector(path=str(peers / f"api-server-{index}.sock"))
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=5)) as s:
            async with s.get("http://api-server/view") as r:
                view = msgspec.msgpack.decode(await r.read(), type=ApiServerView)
    except (aiohttp.ClientError, TimeoutError):
        return None
    families = text_string_to_metric_families(view.exposition)
    return sum(s.value for f in families for s in f.samples if s.name == "vllm:request_success_total")


async def test_a_restarted_api_server_takes_connections_only_once_it_can_serve(tmp_path: Path) -> None:
    """kill -9 of api server 1 under four clients sending short completions, each on a new connection to
    the shared port: every request sent once it was dead is answered 200 (none gets its restart's 503 "no
    engine is up"), and the restarted api server then relays requests too."""
    flags = ("--engines", "2", "--api-server-count", "2", "--engine-restart-backoff", "0.2")
    serve = Serve(tmp_path, *flags, api_servers=2)
    answers: list[Answer] = []
    stop = asyncio.Event()
    clients: list[asyncio.Task[None]] = []
    try:
        serve.wait_serving()
        argv = cmdline(serve.wait_for("api-server0"))
        peers = Path(next(a.split("=", 1)[1] for a in argv if a.startswith("--peers-dir=")))
        clients = [asyncio.create_task(completions(serve.cluster.url, answers, stop)) for _ in range(4)]

        async def answered(count: int) -> bool:
            return len(answers) >= count

        await until(lambda: answered(20), "20 answers before the kill")
        old = serve.wait_for("api-server1")
        os.kill(old, signal.SIGKILL)
        await asyncio.to_thread(wait, lambda: gone(old), 10, f"api server 1 (pid {old}) gone")
        dead = time.monotonic()
        await asyncio.to_thread(serve.wait_for, "api-server1", old)

        async def answers_peers() -> bool:
            return await requests_served(peers, 1) is not None

        await until(answers_peers, "the restarted api server answering its peers")
        before = await requests_served(peers, 1)  # its restored count: it relays none before it is up

        async def relayed() -> bool:
            return (await requests_served(peers, 1) or 0.0) > (before or 0.0)

        await until(relayed, "the restarted api server relaying requests")
    finally:
        stop.set()
        await asyncio.gather(*clients)
        serve.close()
    since = [a for a in answers if a.started >= dead]
    failed = [a for a in since if a.status != 200]
    assert since and not failed, (len(since), failed[:5])
    print(f"{len(since)} requests sent after the kill, all answered 200")
