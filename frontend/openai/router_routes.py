"""What routers in front of a node read from it, in the shapes the PyPI routers parse (vllm-router 0.1.17, smg
1.13.0, sglang-router 0.3.2, each run against a node): server and model info, where its engines publish KV
events, and its load.

=========================================  =========================================================
``GET /get_server_info``, ``/server_info``  vllm-router (``model_id``, ``instance_id``,
                                            ``kv_block_size``: without it no KV index), smg and
                                            sglang-router (``served_model_name``, ``dp_size``, ...)
``GET /model_info``, ``/get_model_info``    smg, sglang-router
``GET /kv_event_sources``                   vllm-router ``--policy kv_aware``: one source per engine
``GET /get_load``                           vllm-router's ``/get_loads``: ``{"load": N}``
``GET /v1/loads``                           smg's load monitor (every ``--load-monitor-interval``)
=========================================  =========================================================

Each describes the node's live engines (503 while none is up, so that no router takes "no engines" for the
node's lasting state): an engine is a data-parallel rank to a router, its engine index the rank (the index
its KV event batches carry as ``data_parallel_rank``). Like every route but /health and /metrics, they need
the API key where one is set.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

import msgspec
from aiohttp import web

from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.registry import EngineRecord, ServedModel
from openinfer.frontend.openai.errors import no_engine
from openinfer.frontend.openai.utility_routes import package_version
from openinfer.protocol import LoadSnapshot
from openinfer.protocol.kv_events import KVEventsEndpoint

# vllm-router accepts a source only with exactly these (found by trial: schema_version 0, 2 or "1" is refused)
_PUBLISHER, _ENCODING, _SCHEMA_VERSION = "zmq", "msgpack", 1


class ServerInfo(msgspec.Struct):
    """``/get_server_info`` and ``/server_info``: one flat object the three routers read (each its keys)."""

    model_id: str  # vllm-router: the cache identity (nodes with one model share one KV index)
    served_model_name: str  # sglang-router's and smg's model id
    model_path: str  # the served name too: a frontend has no path (its tokenizer comes from the engines)
    instance_id: str  # vllm-router: the KV event source's id (host:port of this server)
    # vllm-router: tokens per block in the KV events (the first engine's). Never beside its alias
    # "block_size": vllm-router 0.1.17 refuses a body with both (serde's duplicate field), and indexes nothing.
    kv_block_size: int
    max_model_len: int
    context_length: int  # smg's name for max_model_len
    dp_size: int  # live engines
    pp_size: int  # openinfer has no pipeline parallelism
    max_total_tokens: int  # KV cache tokens over the live engines
    version: str  # openinfer's, as /version answers
    is_embedding: bool = False


class ModelInfo(msgspec.Struct):
    """``/model_info`` and ``/get_model_info`` (smg, sglang-router). ``model_type`` and ``architectures``
    are left out: the engines' hellos do not say them, and both routers take their absence."""

    model_path: str
    tokenizer_path: str
    served_model_name: str
    is_generation: bool = True


class KVEventSource(msgspec.Struct):
    """One engine's entry of ``/kv_event_sources``, vllm-router's shape (not vLLM's list): endpoints as the
    engine gave them; the router puts the node's host for a ``*`` or 0.0.0.0 host."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    hwm: int
    buffer_steps: int
    publisher: str = _PUBLISHER
    encoding: str = _ENCODING
    schema_version: int = _SCHEMA_VERSION
    enable_kv_cache_events: bool = True


class RankLoad(msgspec.Struct):
    """One engine's entry of ``/v1/loads`` (smg's schema; a field it reads that openinfer does not measure
    is 0)."""

    dp_rank: int  # the engine index
    num_running_reqs: int
    num_waiting_reqs: int
    num_total_reqs: int
    num_used_tokens: int  # in KV blocks in use
    max_total_num_tokens: int  # in all KV blocks
    token_usage: float  # used / total KV tokens
    cache_hit_rate: float  # prefix-cache hits / queries (tokens) over the engine incarnation; 0 before any
    num_waiting_uncached_tokens: int = 0
    gen_throughput: float = 0.0
    utilization: float = 0.0
    max_running_requests: int = 0


class Loads(msgspec.Struct):
    """``/v1/loads``: smg's load monitor refuses an empty ``loads`` for good, hence 503 without engines."""

    timestamp: str  # ISO 8601, UTC
    dp_rank_count: int
    loads: list[RankLoad]


def server_info(
    model: ServedModel, records: list[EngineRecord], instance_id: str, version: str
) -> ServerInfo:
    """The server info of a node serving ``model`` on the live engines ``records`` (at least one)."""
    return ServerInfo(
        model_id=model.name,
        served_model_name=model.name,
        model_path=model.name,
        instance_id=instance_id,
        kv_block_size=records[0].hello.kv_block_size,  # engines of one model share it
        max_model_len=model.max_model_len,
        context_length=model.max_model_len,
        dp_size=len(records),
        pp_size=1,
        max_total_tokens=sum(r.hello.kv_num_blocks * r.hello.kv_block_size for r in records),
        version=version,
    )


def kv_event_sources(records: list[EngineRecord]) -> dict[str, KVEventSource]:
    """``/kv_event_sources``: by engine index (as a string), each live engine that publishes KV events."""
    return {str(r.index): _source(r.hello.kv_events) for r in records if r.hello.kv_events is not None}


def _source(endpoint: KVEventsEndpoint) -> KVEventSource:
    return KVEventSource(
        endpoint.endpoint, endpoint.replay_endpoint, endpoint.topic, endpoint.hwm, endpoint.buffer_steps
    )


def rank_load(index: int, block_size: int, load: LoadSnapshot) -> RankLoad:
    """Engine ``index``'s load in smg's terms, from its latest snapshot."""
    used, total = load.kv_used_blocks * block_size, load.kv_total_blocks * block_size
    cache = load.prefix_cache
    return RankLoad(
        dp_rank=index,
        num_running_reqs=load.num_running_reqs,
        num_waiting_reqs=load.num_waiting_reqs,
        num_total_reqs=load.num_running_reqs + load.num_waiting_reqs,
        num_used_tokens=used,
        max_total_num_tokens=total,
        token_usage=used / total if total else 0.0,
        cache_hit_rate=cache.hits / cache.queries if cache is not None and cache.queries else 0.0,
    )


def add_router_routes(app: web.Application, client: EngineClient) -> None:
    """Serve the routers' routes on ``app``, describing ``client``'s live engines."""
    routes = _RouterRoutes(client, package_version())
    for path in ("/get_server_info", "/server_info"):
        app.router.add_get(path, routes.server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, routes.model_info)
    app.router.add_get("/kv_event_sources", routes.kv_event_sources)
    app.router.add_get("/get_load", routes.get_load)
    app.router.add_get("/v1/loads", routes.loads)


@dataclass(frozen=True, eq=False)  # handlers compare and hash by identity
class _RouterRoutes:
    """The handlers, reading the engine client's registry."""

    client: EngineClient
    server_version: str

    def _live(self) -> tuple[ServedModel, list[EngineRecord]]:
        """The first served model and the live engines; 503 while no engine is up."""
        served, records = self.client.served_models(), self.client.registry.live()
        if not served or not records:
            raise no_engine("no engine is up; retry when /health answers 200")
        return served[0], records

    async def server_info(self, request: web.Request) -> web.Response:
        model, records = self._live()
        return _json(server_info(model, records, _instance_id(request), self.server_version))

    async def model_info(self, request: web.Request) -> web.Response:
        name = self._live()[0].name
        return _json(ModelInfo(model_path=name, tokenizer_path=name, served_model_name=name))

    async def kv_event_sources(self, request: web.Request) -> web.Response:
        """``{}`` when no live engine publishes KV events."""
        return _json(kv_event_sources(self._live()[1]))

    async def get_load(self, request: web.Request) -> web.Response:
        """``{"load": N}``: the requests the live engines run and queue (vllm-router's shape).

        sglang-router reads the same path as a list, ``[{"dp_rank", "num_reqs", "num_waiting_reqs",
        "num_tokens"}]``, and counts as a node's load the sum of ``num_tokens``; the two shapes cannot both
        be served here. vllm-router's is, so sglang-router sees no load from openinfer (its routing then
        rests on its own counts of the requests it has in flight)."""
        records = self._live()[1]
        return _json({"load": sum(r.load.num_running_reqs + r.load.num_waiting_reqs for r in records)})

    async def loads(self, request: web.Request) -> web.Response:
        """smg's ``/v1/loads``; its ``?include=core,disagg,...`` is taken and ignored (every field is core)."""
        records = self._live()[1]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        loads = [rank_load(r.index, r.hello.kv_block_size, r.load) for r in records]
        return _json(Loads(timestamp=now, dp_rank_count=len(loads), loads=loads))


def _instance_id(request: web.Request) -> str:
    """``host:port`` of the socket the request came in on (the node as routers reach it); the host name
    where that is not an IP socket (a UNIX socket)."""
    transport = request.transport
    address = None if transport is None else transport.get_extra_info("sockname")
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return socket.gethostname()


def _json(body: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")
