"""The PyPI vllm-router (0.1.17, the test extra's) in front of two frontends, each with a real engine publishing
KV events, given nothing but the nodes' URLs: it learns each node's model, block size and event sources from
/get_server_info and /kv_event_sources, renders each request through /v1/completions/render, and under
kv_aware sends a prompt to the node whose prefix cache holds it."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from openinfer.protocol.kv_events import BlockStored, KVEventBatch
from tests.e2e.processes import HOST, Cluster, free_port, free_port_pair
from tests.frontend.frontends import Frontend, FrontendFactory
from tests.frontend.waits import wait_until

ROUTER = Path(sys.executable).parent / "vllm-router"
pytestmark = pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router is not installed (the test extra)")

PROMPTS = [" ".join(f"{word}{n}" for n in range(40)) for word in ("harbour", "orchard")]  # many full blocks


async def served(frontend: Frontend) -> float:
    """Requests the node finished (its vllm:request_success_total, every reason)."""
    async with aiohttp.ClientSession() as session, session.get(f"{frontend.url}/metrics") as response:
        text = await response.text()
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{.*\} (\S+)$", text, re.M))


async def complete(url: str, prompt: str) -> None:
    body = {"model": "fake", "prompt": prompt, "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()


async def stored(subscriber: zmq.asyncio.Socket) -> None:
    """Until a batch storing blocks arrives on ``subscriber``; fail after 30 s."""
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    async with asyncio.timeout(30):
        while True:
            *_, payload = await subscriber.recv_multipart()
            if any(isinstance(event, BlockStored) for event in decoder.decode(payload).events):
                return


async def test_kv_aware_vllm_router_discovers_the_nodes_and_routes_by_prefix(
    start_frontend: FrontendFactory, tmp_path: Path
) -> None:
    """A prompt first sent to node i directly (so that only node i caches it, and says so in its KV events)
    then goes through the router to node i, for i = 0 and 1: no fixed tie-break does both."""
    clusters = [Cluster(tmp_path / f"node{i}") for i in range(2)]
    context = zmq.asyncio.Context()
    router: subprocess.Popen[bytes] | None = None
    try:
        # the frontends bind their engine ports first: the KV ports are chosen among those still free
        nodes = [await start_frontend(engine_address=cluster.engine_address) for cluster in clusters]
        kv_ports = [free_port_pair()]
        while len(kv_ports) < 2:
            kv_ports += [port for port in [free_port_pair()] if abs(port - kv_ports[0]) > 1]
        subscribers = []
        for cluster, kv_port in zip(clusters, kv_ports, strict=True):
            endpoint = f"tcp://{HOST}:{kv_port}"
            config = {"enable_kv_cache_events": True, "endpoint": endpoint}
            cluster.start_fake_engine(0, "--kv-events-config", json.dumps(config))
            subscribers.append(context.socket(zmq.SUB))
            subscribers[-1].setsockopt(zmq.SUBSCRIBE, b"")
            subscribers[-1].connect(endpoint)
        for node in nodes:
            await wait_until(lambda node=node: node.client.num_engines_up == 1, timeout=120)
        port = free_port()
        args = ["--host", HOST, "--port", str(port), "--policy", "kv_aware", "--log-level", "debug"]
        args += ["--prometheus-host", HOST, "--prometheus-port", str(free_port())]
        args += ["--worker-startup-check-interval", "1", "--worker-urls", *(node.url for node in nodes)]
        with (tmp_path / "router.log").open("wb") as log:
            router = subprocess.Popen([str(ROUTER), *args], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://{HOST}:{port}"
        await _wait_ready(url, router)
        await asyncio.sleep(1)  # its subscribers connect (nothing to wait on)

        for node, subscriber, prompt in zip(nodes, subscribers, PROMPTS, strict=True):
            await complete(node.url, prompt)
            await stored(subscriber)
        await asyncio.sleep(1)  # the router's subscribers got the same batches; they apply them
        went = []
        for prompt in PROMPTS:
            before = [await served(node) for node in nodes]
            await complete(url, prompt)
            after = [await served(node) for node in nodes]
            went.append([i for i in range(2) if after[i] > before[i]])
        assert went == [[0], [1]], (tmp_path / "router.log").read_text()[-4000:]
    finally:
        if router is not None:
            router.kill()
            router.wait(10)
        context.destroy(linger=0)
        for cluster in clusters:
            cluster.stop()


async def _wait_ready(url: str, router: subprocess.Popen[bytes]) -> None:
    """Until the router answers /readiness 200 (its workers registered); fail after 60 s or if it exits."""
    async with asyncio.timeout(60), aiohttp.ClientSession() as session:
        while True:
            assert router.poll() is None, "vllm-router exited"
            try:
                async with session.get(f"{url}/readiness") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
