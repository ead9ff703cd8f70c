"""Admin routes: list the engines, load or unload an engine's drafter at run time.

- ``GET /admin/engines``: every engine this frontend knows, live or not, with its load; and
  ``counted_seqs``, by engine index, the seqs of each incarnation ``/metrics`` counted
  (:mod:`openinfer.frontend.metrics.spec_decode.counted_seqs`).
- ``POST /admin/engines/{index}/drafter`` with ``{"method": "ngram"|"dflash"|"dspark", "num_spec_tokens": K,
  "draft_model": PATH (dflash, dspark), "prompt_lookup_min": 1, "prompt_lookup_max": 4 (ngram),
  "confidence_threshold": 0.0 (dspark), "enable_adaptive_verification": false}``: load (or replace) the
  drafter; 200 ``{"engine", "num_spec_tokens", "message"}`` once the engine says it is done. Without
  ``draft_model`` an engine serving the built-in target loads its built-in drafter of that method; any other
  engine refuses (a 400 saying to pass one).
- ``DELETE /admin/engines/{index}/drafter``: speculative decoding off on that engine.

Errors: 400 for a bad body or the engine's refusal (its message), 413 for a body over
:data:`MAX_BODY_BYTES`, 404 for an unknown or down engine, 503 when the engine restarts or cannot be reached,
504 when it does not answer in time. They need the API key.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, get_args

import msgspec
from aiohttp import web

from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.errors import EngineCommandError, NoEngineError
from openinfer.frontend.engines.registry import EngineRecord
from openinfer.frontend.metrics.api_servers import ApiServers
from openinfer.frontend.openai.body.decode import Int64, decode_body
from openinfer.frontend.openai.body.limits import read_body
from openinfer.frontend.openai.errors import ApiError, invalid_request
from openinfer.protocol import (
    MAX_SPEC_TOKENS,
    DFlashAnchor,
    DrafterMethod,
    LoadDrafter,
    LoadSnapshot,
    UnloadDrafter,
)
from openinfer.protocol.counters import num_spec_tokens_problem

# Methods the engine knows (docs/design.md, models and drafters); "draft_model" is DFlash's checkpoint folder.
_METHODS: tuple[DrafterMethod, ...] = get_args(DrafterMethod)
# Where a DFlash block's position 0 is, when the checkpoint's config does not say.
_ANCHORS: tuple[DFlashAnchor, ...] = get_args(DFlashAnchor)
# A drafter body is a few short fields and a folder path (PATH_MAX is 4096 bytes): far below this.
MAX_BODY_BYTES = 64 * 1024


class DrafterBody(msgspec.Struct, forbid_unknown_fields=True):
    """The JSON body of ``POST /admin/engines/{index}/drafter``."""

    method: str  # a DrafterMethod; checked after decoding, so that a wrong one gets its own message
    num_spec_tokens: Int64
    draft_model: str | None = None
    prompt_lookup_min: Int64 = 1
    prompt_lookup_max: Int64 = 4  # vLLM bounds neither above; the n-gram drafter is bounded by the sequence
    path: str | None = None  # another name for draft_model
    dflash_anchor: str | None = None  # a DFlashAnchor, checked after decoding
    confidence_threshold: float = 0.0  # dspark: verify drafts up to the first below it
    enable_adaptive_verification: bool = False  # verify the drafts that pay (the engine must have profiled)


def parse_load_drafter(body: bytes, command_id: str) -> LoadDrafter:
    """Validate a drafter body into a :class:`LoadDrafter`; :class:`ApiError` 400 naming what is wrong.

    K outside [1, MAX_SPEC_TOKENS] is refused, never clamped (docs/design.md, counter semantics).
    """
    drafter = decode_body(body, DrafterBody, {})
    if drafter.path is not None:
        if drafter.draft_model is not None and drafter.draft_model != drafter.path:
            raise invalid_request(
                "give the DFlash folder as `draft_model` or `path`, not two different ones", "path"
            )
        drafter.draft_model = drafter.path
    if drafter.dflash_anchor is not None and drafter.dflash_anchor not in _ANCHORS:
        raise invalid_request("`dflash_anchor` must be mask_slots or anchor_slot", "dflash_anchor")
    if drafter.method not in _METHODS:
        raise invalid_request(f"`method` must be one of {list(_METHODS)}, got {drafter.method!r}", "method")
    k = drafter.num_spec_tokens
    if num_spec_tokens_problem(k) is not None:  # K's one range (protocol/counters.py), in the API's words
        raise invalid_request(
            f"`num_spec_tokens` {k} exceeds MAX_SPEC_TOKENS = {MAX_SPEC_TOKENS}, the longest proposal the "
            f"acceptance counters describe; choose K in [1, {MAX_SPEC_TOKENS}]"
            if k >= 1
            else f"`num_spec_tokens` must be at least 1, got {k}",
            "num_spec_tokens",
        )
    if drafter.draft_model == "":
        raise invalid_request(
            "`draft_model` is empty: give the checkpoint folder as the engine's host sees it, or leave it out "
            "for the built-in target's own drafter",
            "draft_model",
        )
    if drafter.method == "ngram" and drafter.draft_model is not None:
        raise invalid_request(
            "`draft_model` is only for methods dflash and dspark; ngram needs no model", "draft_model"
        )
    threshold = drafter.confidence_threshold
    if not 0.0 <= threshold <= 1.0 or (threshold and drafter.method != "dspark"):
        raise invalid_request(
            f"`confidence_threshold` must be in [0, 1], and non-zero only for method dspark; got {threshold}",
            "confidence_threshold",
        )
    if not 1 <= drafter.prompt_lookup_min <= drafter.prompt_lookup_max:
        raise invalid_request(
            "need 1 <= `prompt_lookup_min` <= `prompt_lookup_max`, got "
            f"{drafter.prompt_lookup_min} and {drafter.prompt_lookup_max}",
            "prompt_lookup_min",
        )
    return LoadDrafter(
        command_id,
        drafter.method,
        k,
        drafter.draft_model,
        drafter.prompt_lookup_min,
        drafter.prompt_lookup_max,
        drafter.dflash_anchor,
        threshold,
        drafter.enable_adaptive_verification,
    )


def add_admin_routes(
    app: web.Application,
    client: EngineClient,
    drafter_timeout: float,
    body_timeout: float,
    api_servers: ApiServers | None = None,
) -> None:
    """Add the admin routes to ``app``; drafter commands wait ``drafter_timeout`` seconds for the engine, and
    a body not all in within ``body_timeout`` seconds is a 408. With ``api_servers``, the counted seqs are
    those of every api server sharing the port."""
    admin = _AdminApi(client, drafter_timeout, body_timeout, api_servers)
    app.router.add_get("/admin/engines", admin.engines)
    app.router.add_post(r"/admin/engines/{index:\d+}/drafter", admin.load_drafter)
    app.router.add_delete(r"/admin/engines/{index:\d+}/drafter", admin.unload_drafter)


@dataclass(frozen=True, eq=False)  # handlers compare and hash by identity
class _AdminApi:
    """The /admin route handlers, sharing the engine client."""

    client: EngineClient
    drafter_timeout: float
    body_timeout: float
    api_servers: ApiServers | None

    async def engines(self, request: web.Request) -> web.Response:
        records = self.client.registry.records()
        engines = [_engine_json(record) for record in records]
        # which spec-log lines /metrics holds, per incarnation (openinfer-verify-log --engines-url reads it)
        servers = self.api_servers
        counted = (
            self.client.metrics.counted_seqs.to_json() if servers is None else await servers.counted_seqs()
        )
        return web.json_response({"engines": engines, "counted_seqs": counted})

    async def load_drafter(self, request: web.Request) -> web.Response:
        body = await read_body(request, MAX_BODY_BYTES, self.body_timeout, _too_large)
        command = parse_load_drafter(body, uuid.uuid4().hex)
        return await self._run(int(request.match_info["index"]), command)

    async def unload_drafter(self, request: web.Request) -> web.Response:
        return await self._run(int(request.match_info["index"]), UnloadDrafter(uuid.uuid4().hex))

    async def _run(self, index: int, command: LoadDrafter | UnloadDrafter) -> web.Response:
        name = type(command).__name__
        try:
            reply = await self.client.drafter_command(index, command, self.drafter_timeout)
        except NoEngineError as e:
            raise ApiError(404, str(e), code="engine_not_found") from None
        except EngineCommandError as e:
            raise ApiError(503, str(e), type_="service_unavailable", code="engine_unavailable") from None
        except TimeoutError:
            raise ApiError(
                504,
                f"engine {index} did not answer {name} within {self.drafter_timeout:g} s; it may still be working: "
                "GET /admin/engines shows its num_spec_tokens",
                type_="server_error",
                code="timeout",
            ) from None
        if not reply.ok:
            raise ApiError(400, reply.message, code="drafter_refused")
        return web.json_response(
            {"engine": index, "num_spec_tokens": reply.num_spec_tokens, "message": reply.message}
        )


def _too_large(length: int | None) -> ApiError:
    size = f"{length} bytes, more than" if length is not None else "more than"
    return ApiError(
        413,
        f"the request body is {size} the {MAX_BODY_BYTES} bytes a drafter command can need; send only its "
        "fields",
        code="request_too_large",
    )


def _engine_json(record: EngineRecord) -> dict[str, Any]:
    return {
        "index": record.index,
        "incarnation": f"{record.incarnation:016x}",  # as in the engine's spec log and ZMQ identity
        "up": record.up,
        "model": record.model_name,
        "num_spec_tokens": record.num_spec_tokens,
        "load": _load_json(record.load),
    }


def _load_json(load: LoadSnapshot) -> dict[str, Any]:
    spec = load.spec_decode
    return {
        "kv_used_blocks": load.kv_used_blocks,
        "kv_total_blocks": load.kv_total_blocks,
        "num_running_reqs": load.num_running_reqs,
        "num_waiting_reqs": load.num_waiting_reqs,
        "spec_decode": None if spec is None else msgspec.structs.asdict(spec),
    }
