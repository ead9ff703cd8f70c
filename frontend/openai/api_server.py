"""The OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions, /v1/models, /health, Prometheus
/metrics, /admin, vLLM's /tokenize, /detokenize and /version, and what routers in front read (server and
model info, loads, KV event sources: :mod:`~openinfer.frontend.openai.router_routes`; the render routes:
:mod:`~openinfer.frontend.openai.render_routes`), behind the middlewares of
:mod:`openinfer.frontend.openai.middleware`."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.errors import NoEngineError
from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.metrics.api_servers import ApiServers
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.spec_decode.per_request import PerRequestSpecMetrics
from openinfer.frontend.openai.admin_api import add_admin_routes
from openinfer.frontend.openai.body.census_worker import CensusWorker
from openinfer.frontend.openai.body.limits import BodyLimits
from openinfer.frontend.openai.chat_request import ChatRequest, parse_chat_request
from openinfer.frontend.openai.choices import Choices
from openinfer.frontend.openai.completion_request import CompletionRequest, parse_completion_request
from openinfer.frontend.openai.cors import CorsPolicy
from openinfer.frontend.openai.errors import ApiError, engine_failed, invalid_request, no_engine
from openinfer.frontend.openai.generation import EngineRequestError
from openinfer.frontend.openai.grammar_pool import GrammarCheckPool
from openinfer.frontend.openai.host_check import host_check_middleware
from openinfer.frontend.openai.middleware import (
    MAX_BODY_BYTES,
    REQUEST_IDENTITY,
    auth_middleware,
    echo_request_id,
    error_middleware,
    json_body_middleware,
    request_id_middleware,
)
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from openinfer.frontend.openai.render_routes import add_render_routes
from openinfer.frontend.openai.request_preparation import prepare_request
from openinfer.frontend.openai.response_format import ResponseIds
from openinfer.frontend.openai.router_routes import add_router_routes
from openinfer.frontend.openai.structured_outputs_config import StructuredOutputsConfig
from openinfer.frontend.openai.template_pool import ChatTemplatePool
from openinfer.frontend.openai.utility_routes import add_utility_routes

logger = logging.getLogger(__name__)

# The app's grammar check and chat template workers (their pids: for tests and operators).
GRAMMAR_CHECKS = web.AppKey("openinfer_grammar_checks", GrammarCheckPool)
CHAT_TEMPLATES = web.AppKey("openinfer_chat_templates", ChatTemplatePool)
BODY_CENSUS = web.AppKey("openinfer_body_census", CensusWorker)


def build_app(
    client: EngineClient,
    metrics: FrontendMetrics,
    api_key: str | None = None,
    per_request_spec_metrics: PerRequestSpecMetrics = PerRequestSpecMetrics.SUMMARY,
    drafter_timeout: float = 120.0,
    chat_parsers: ChatParsers | None = None,
    structured_config: StructuredOutputsConfig | None = None,
    admin_api_key: str | None = None,
    cors: CorsPolicy | None = None,
    loopback_host: str | None = None,
    grammar_check_timeout: float = 5.0,
    body_timeout: float = 60.0,
    api_servers: ApiServers | None = None,
    chat_template_timeout: float = 5.0,
) -> web.Application:
    """The aiohttp application; with ``api_key`` every route but /health and /metrics needs the Bearer key.
    The /admin routes need ``admin_api_key`` (or, without it, ``api_key``) and are off without either.

    ``per_request_spec_metrics`` says what a request's final response tells of its speculative decoding;
    ``drafter_timeout`` is how long the admin drafter routes wait for the engine's reply; ``chat_parsers``
    read reasoning and tool calls out of chat output (default: none, the output is left as written);
    ``structured_config`` is the server's side of structured outputs. ``cors``: which other origins' pages
    may call the API (None: no CORS headers at all). ``loopback_host``: the loopback address the server
    listens on, if it does, so that only requests addressed to a loopback name are served (DNS rebinding).
    A structured-outputs constraint that takes longer than ``grammar_check_timeout`` seconds to compile is a
    400 before it reaches an engine (one that waits as long for a free worker to check it, a 503). A request
    body not all in within ``body_timeout`` seconds is a 408. ``api_servers``: this frontend is one of
    several sharing the port, and /metrics and /admin/engines show all of them. A model's chat template that
    takes longer than ``chat_template_timeout`` seconds to render a request's messages is a 500.
    """
    # A check waits for a free worker at most as long as one may compile: past it, 503 busy.
    grammar_checks = GrammarCheckPool(grammar_check_timeout, wait_timeout=grammar_check_timeout)
    census = CensusWorker()
    templates = ChatTemplatePool(chat_template_timeout)
    api = _OpenAIApi(
        client,
        metrics,
        per_request_spec_metrics,
        chat_parsers or ChatParsers(),
        structured_config or StructuredOutputsConfig(),
        grammar_checks,
        templates,
        census,
        body_timeout,
        api_servers,
    )
    middlewares: list[Middleware] = [error_middleware]  # the first is the outermost
    if loopback_host is not None:
        middlewares.append(host_check_middleware(loopback_host))
    middlewares.append(request_id_middleware)
    if cors is not None:  # preflights carry no key: answered before authentication
        middlewares.append(cors.preflight_middleware())
    middlewares += [auth_middleware(api_key, admin_api_key), json_body_middleware]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app.on_response_prepare.append(echo_request_id)
    if cors is not None:
        app.on_response_prepare.append(cors.add_headers)
    app[GRAMMAR_CHECKS] = grammar_checks
    app[BODY_CENSUS] = census
    app[CHAT_TEMPLATES] = templates
    app.on_startup.append(_start_workers)
    app.on_cleanup.append(_close_workers)
    app.router.add_get("/health", api.health)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/v1/models", api.models)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    add_admin_routes(app, client, drafter_timeout, body_timeout, api_servers)
    add_utility_routes(app, api._body, api._model, templates)
    add_router_routes(app, client)
    add_render_routes(app, api._body, api._model, templates, api.chat_parsers, api.structured_config)
    return app


async def _start_workers(app: web.Application) -> None:
    app[CHAT_TEMPLATES].start()  # every chat needs one: warm before the first


async def _close_workers(app: web.Application) -> None:
    await app[BODY_CENSUS].close()
    await app[GRAMMAR_CHECKS].close()
    await app[CHAT_TEMPLATES].close()


@dataclass(frozen=True, eq=False)  # handlers compare and hash by identity
class _OpenAIApi:
    """The route handlers, sharing the engine client and the metrics."""

    client: EngineClient
    frontend_metrics: FrontendMetrics
    spec_metrics: PerRequestSpecMetrics
    chat_parsers: ChatParsers
    structured_config: StructuredOutputsConfig
    grammar_checks: GrammarCheckPool
    templates: ChatTemplatePool
    census: CensusWorker
    body_timeout: float
    api_servers: ApiServers | None

    async def health(self, request: web.Request) -> web.Response:
        """200 once at least one engine is up, else 503."""
        num_up = self.client.num_engines_up
        if num_up == 0:
            raise no_engine("no engine is up")
        return web.json_response({"status": "ok", "engines_up": num_up})

    async def metrics(self, request: web.Request) -> web.Response:
        servers = self.api_servers
        body = self.frontend_metrics.render() if servers is None else await servers.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        """OpenAI's model list: every model name a live engine serves."""
        created = int(time.time())
        data = [
            {
                "id": model.name,
                "object": "model",
                "created": created,
                "owned_by": "openinfer",
                "root": model.name,
                "max_model_len": model.max_model_len,
            }
            for model in self.client.served_models()
        ]
        return _json({"object": "list", "data": data})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's completions endpoint, streaming (SSE) or not."""
        arrival = time.monotonic()
        completion = parse_completion_request(await self._body(request), self.structured_config)
        return await self._generate(request, completion, arrival)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's chat completions endpoint: the messages through the model's chat template."""
        arrival = time.monotonic()
        chat = parse_chat_request(await self._body(request), self.chat_parsers, self.structured_config)
        return await self._generate(request, chat, arrival)

    async def _generate(
        self, request: web.Request, parsed: CompletionRequest | ChatRequest, arrival: float
    ) -> web.StreamResponse:
        """Run a parsed request on its model: its constraint checked (the one place the frontend compiles
        one), then prepared once into its engine request and response format, run as its ``n`` choices."""
        model = self._model(parsed.model)
        options = parsed.options
        if options.structured is not None:
            await self.grammar_checks.check(options.structured)
        ids = _response_ids(request, parsed.response_prefix, model)
        prepared = await prepare_request(parsed, model, _engine_request_id(request, ids), self.templates)
        choices = Choices(
            self.client, self.frontend_metrics, model, prepared, options, arrival, ids, self.spec_metrics
        )
        try:
            async with choices:
                if options.stream:
                    return await self._stream(request, choices)
                return await self._complete(choices)
        except NoEngineError as e:
            raise no_engine(str(e)) from None

    async def _body(self, request: web.Request) -> bytes:
        """The request's body, within what the served models can take (:class:`BodyLimits`) and in within
        the body deadline, checked before it is decoded; 503 while no engine is up, before reading it."""
        served = self.client.served_models()
        if not served:
            raise no_engine("no engine is up; retry when /health answers 200")
        return await BodyLimits.for_models(served).read(request, self.census, self.body_timeout)

    def _model(self, name: str | None) -> ServedModel:
        """The model a request names, or the first served one; 503 if no engine is up, 404 if unknown."""
        served = self.client.served_models()
        if not served:
            raise no_engine("no engine is up; retry when /health answers 200")
        model = served[0] if name is None else self.client.served_model(name)
        if model is None:
            served_names = ", ".join(m.name for m in served)
            message = f"The model `{name}` does not exist; this server serves: {served_names}."
            raise ApiError(404, message, param="model", code="model_not_found")
        return model

    async def _complete(self, choices: Choices) -> web.Response:
        try:
            return _json(await choices.response())
        except EngineRequestError as e:
            raise _engine_error(choices, e) from None

    async def _stream(self, request: web.Request, choices: Choices) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        try:
            await response.prepare(request)  # the client may be gone already: the headers cannot go out
            async with aclosing(_stream_events(choices)) as events:
                async for event in events:
                    await response.write(_sse(event))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:  # the client went away; leaving the choices aborts them on the engine
            logger.debug("the client of request %s disconnected from its stream", choices.request_id)
        return response


async def _stream_events(choices: Choices) -> AsyncGenerator[dict[str, Any]]:
    """The choices' chunks; an engine error becomes an error event (a refusal's is a 400's body)."""
    try:
        async for chunk in choices.chunks():
            yield chunk
    except EngineRequestError as e:
        yield _engine_error(choices, e).body()


def _engine_error(choices: Choices, error: EngineRequestError) -> ApiError:
    """What the client is told of an engine's error finish: a 400 where the engine refused what the request
    asks, else a 500 (a stream's error event carries its body)."""
    # Logged with %r: the engine's words may quote the request's own text, whose newlines could forge lines.
    if error.bad_request:
        logger.info("request %s refused by its engine: %r", choices.request_id, str(error))
        return invalid_request(str(error))
    logger.warning("request %s failed on its engine: %r", choices.request_id, str(error))
    return engine_failed(str(error))


def _response_ids(request: web.Request, prefix: str, model: ServedModel) -> ResponseIds:
    """The response's id is the request id behind the endpoint's prefix (vLLM's "cmpl-" / "chatcmpl-")."""
    return ResponseIds(f"{prefix}-{request[REQUEST_IDENTITY].request_id}", int(time.time()), model.name)


def _engine_request_id(request: web.Request, ids: ResponseIds) -> str:
    """The id the engine runs the request under: the response id, plus a random suffix when the client
    chose the request id, since two requests in flight may carry the same one."""
    if request[REQUEST_IDENTITY].from_client:
        return f"{ids.id}-{uuid.uuid4().hex[:8]}"
    return ids.id


def _json(body: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _sse(event: object) -> bytes:
    return b"data: " + msgspec.json.encode(event) + b"\n\n"
