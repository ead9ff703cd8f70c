"""The routes routers read (server and model info, KV event sources, loads): the exact shapes vllm-router, smg
and sglang-router parse, what they say of the live engines, 503 without one, and the API key."""

from __future__ import annotations

import asyncio
import datetime
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from openinfer.protocol import PrefixCacheCounters
from openinfer.protocol.kv_events import BlockStored, KVEventBatch, KVEventsEndpoint
from tests.e2e.processes import Cluster, free_port_pair
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.openai.http_calls import get, post
from tests.frontend.waits import wait_until

VERSION = importlib.metadata.version("openinfer")
GET_ROUTES = [
    "/get_server_info",
    "/server_info",
    "/model_info",
    "/get_model_info",
    "/kv_event_sources",
    "/get_load",
    "/v1/loads",
]
# Where a peer says it publishes (it publishes nothing: the frontend only passes this on).
PEER_EVENTS = KVEventsEndpoint("tcp://*:5557", "tcp://*:5558", "kv", 100_000, 10_000)


async def get_json(frontend: Frontend, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    status, text = await get(frontend, path, headers)
    return status, json.loads(text)


def http_address(frontend: Frontend) -> str:
    return frontend.url.removeprefix("http://")


async def test_server_info_describes_the_live_engines(frontend: Frontend, start_peer: PeerFactory) -> None:
    """Both paths answer one flat object: the served name for model_id / path, this server's host:port, the
    engines' block size, and dp_size and max_total_tokens over the live engines (a dead one drops out)."""
    await start_peer(frontend)
    second = await start_peer(frontend, PeerConfig(engine_index=1))
    expected = {
        "model_id": "tiny",
        "served_model_name": "tiny",
        "model_path": "tiny",
        "instance_id": http_address(frontend),
        "kv_block_size": 16,  # alone: vllm-router refuses it beside its alias block_size
        "max_model_len": 64,
        "context_length": 64,
        "dp_size": 2,
        "pp_size": 1,
        "max_total_tokens": 2 * 64 * 16,  # each peer: 64 blocks of 16 tokens
        "version": VERSION,
        "is_embedding": False,
    }
    assert await get_json(frontend, "/get_server_info") == (200, expected)
    assert await get_json(frontend, "/server_info") == (200, expected)
    await second.stop()
    await wait_until(lambda: frontend.client.num_engines_up == 1, timeout=10)
    one_engine = {**expected, "dp_size": 1, "max_total_tokens": 64 * 16}
    assert await get_json(frontend, "/server_info") == (200, one_engine)


async def test_model_info_names_the_served_model(frontend: Frontend, start_peer: PeerFactory) -> None:
    """smg's and sglang-router's model info: the served name as path and tokenizer path, a generation model;
    no model_type / architectures, which no hello says."""
    await start_peer(frontend)
    expected = {
        "model_path": "tiny",
        "tokenizer_path": "tiny",
        "served_model_name": "tiny",
        "is_generation": True,
    }
    assert await get_json(frontend, "/model_info") == (200, expected)
    assert await get_json(frontend, "/get_model_info") == (200, expected)


async def test_kv_event_sources_are_keyed_by_engine_index(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """vllm-router's map: each publishing engine by its index (its batches' data_parallel_rank), endpoints
    as the engine gave them, with the keys and values vllm-router requires; an engine that does not publish
    is left out, and none publishing is {}."""
    quiet = await start_peer(frontend)
    assert await get_json(frontend, "/kv_event_sources") == (200, {})
    await start_peer(frontend, PeerConfig(engine_index=3, kv_events=PEER_EVENTS))
    expected = {
        "3": {
            "endpoint": "tcp://*:5557",
            "replay_endpoint": "tcp://*:5558",
            "topic": "kv",
            "hwm": 100_000,
            "buffer_steps": 10_000,
            "publisher": "zmq",
            "encoding": "msgpack",
            "schema_version": 1,
            "enable_kv_cache_events": True,
        }
    }
    assert await get_json(frontend, "/kv_event_sources") == (200, expected)
    await quiet.stop()
    await wait_until(lambda: frontend.client.num_engines_up == 1, timeout=10)
    assert await get_json(frontend, "/kv_event_sources") == (200, expected)


async def test_loads_reflect_running_requests(frontend: Frontend, start_peer: PeerFactory) -> None:
    """/get_load is vllm-router's {"load": running + waiting}; /v1/loads is smg's schema, one entry per
    engine from its latest load snapshot (its ?include= taken and ignored)."""
    config = PeerConfig(token_delay_s=0.1, prefix_cache=PrefixCacheCounters(queries=40, hits=10))
    await start_peer(frontend, config)
    assert await get_json(frontend, "/get_load") == (200, {"load": 0})
    running = asyncio.create_task(post(frontend, {"prompt": "hello world", "max_tokens": 40}))
    try:
        await wait_until(lambda: frontend.client.registry.live()[0].load.num_running_reqs == 1)
        assert await get_json(frontend, "/get_load") == (200, {"load": 1})
        status, body = await get_json(frontend, "/v1/loads?include=core,disagg,queues,memory")
        assert status == 200
        stamp = datetime.datetime.fromisoformat(body.pop("timestamp"))
        assert stamp.tzinfo == datetime.UTC
        assert abs((datetime.datetime.now(datetime.UTC) - stamp).total_seconds()) < 60
        load = {
            "dp_rank": 0,
            "num_running_reqs": 1,
            "num_waiting_reqs": 0,
            "num_total_reqs": 1,
            "num_used_tokens": 16,  # the peer holds one 16-token block per running request
            "max_total_num_tokens": 64 * 16,
            "token_usage": 1 / 64,
            "cache_hit_rate": 0.25,  # 10 of 40 looked-up tokens
            "num_waiting_uncached_tokens": 0,
            "gen_throughput": 0.0,
            "utilization": 0.0,
            "max_running_requests": 0,
        }
        assert body == {"dp_rank_count": 1, "loads": [load]}
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    await wait_until(lambda: frontend.client.registry.live()[0].load.num_running_reqs == 0)
    assert await get_json(frontend, "/get_load") == (200, {"load": 0})


@pytest.mark.parametrize("path", GET_ROUTES)
async def test_no_engine_is_503(frontend: Frontend, path: str) -> None:
    """Before any engine is up each route is an OpenAI 503 (smg would take an empty load list as the node's
    for good)."""
    status, body = await get_json(frontend, path)
    assert status == 503 and body["error"]["code"] == "no_engine"


async def test_the_api_key_guards_the_router_routes(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """With --api-key every route needs it, as every route but /health and /metrics does."""
    frontend = await start_frontend(api_key="sesame")
    await start_peer(frontend)
    for path in GET_ROUTES:
        for headers in [None, {"Authorization": "Bearer wrong"}]:
            status, body = await get_json(frontend, path, headers)
            assert status == 401 and body["error"]["code"] == "invalid_api_key", path
        assert (await get(frontend, path, {"Authorization": "Bearer sesame"}))[0] == 200, path


async def test_a_real_engine_publishing_kv_events_is_listed_until_it_dies(
    start_frontend: FrontendFactory, tmp_path: Path
) -> None:
    """Two real engines, the first started with --kv-events-config: /kv_event_sources lists it under "0",
    the data_parallel_rank its batches carry, at the endpoints it binds; once it is killed, the other stays
    and the map is {}."""
    cluster = Cluster(tmp_path)
    frontend = await start_frontend(engine_address=cluster.engine_address)  # bound before ports are chosen
    pub_port = free_port_pair()
    replay_port = free_port_pair()
    while abs(replay_port - pub_port) < 2:
        replay_port = free_port_pair()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://127.0.0.1:{pub_port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
    }
    context = zmq.asyncio.Context()
    try:
        cluster.start_fake_engine(0, "--kv-events-config", json.dumps(config))
        cluster.start_fake_engine(1)
        await wait_until(lambda: frontend.client.num_engines_up == 2, timeout=120)
        status, sources = await get_json(frontend, "/kv_event_sources")
        assert status == 200 and list(sources) == ["0"]
        assert sources["0"]["endpoint"] == config["endpoint"]
        assert sources["0"]["replay_endpoint"] == config["replay_endpoint"]
        assert (sources["0"]["topic"], sources["0"]["hwm"], sources["0"]["buffer_steps"]) == (
            "",
            100_000,
            10_000,
        )

        subscriber = context.socket(zmq.SUB)
        subscriber.setsockopt(zmq.LINGER, 0)
        subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        subscriber.connect(sources["0"]["endpoint"])
        stored = await _first_stored_batch(frontend, subscriber)
        assert stored.data_parallel_rank == 0
        subscriber.close()

        cluster.kill("engine0")
        await wait_until(lambda: frontend.client.num_engines_up == 1, timeout=15)
        assert await get_json(frontend, "/kv_event_sources") == (200, {})
    finally:
        context.destroy(linger=0)
        cluster.stop()


async def _first_stored_batch(frontend: Frontend, subscriber: zmq.asyncio.Socket) -> KVEventBatch:
    """Send prompts of several blocks to engine 0 until a batch storing blocks arrives (a subscriber misses
    what was published before it joined); fail after 60 s."""
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    prompt = " ".join(f"word{i}" for i in range(40))  # 8+ blocks of the fake engine's 16 tokens
    deadline = asyncio.get_running_loop().time() + 60
    attempt = 0
    while asyncio.get_running_loop().time() < deadline:
        for _ in range(2):  # the frontend spreads requests over both engines; each prompt new (uncached)
            attempt += 1
            body = {"model": "fake", "prompt": f"{attempt} {prompt}", "max_tokens": 1}
            assert (await post(frontend, body))[0] == 200
        while await subscriber.poll(500):
            *_, payload = await subscriber.recv_multipart()
            batch = decoder.decode(payload)
            if any(isinstance(event, BlockStored) for event in batch.events):
                return batch
    raise AssertionError("engine 0 published no BlockStored batch within 60 s")
