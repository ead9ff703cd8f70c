"""The OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions, /v1/models, /health, Prometheus
/metrics and /admin; request ids, the API key and OpenAI error bodies for every route."""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.errors import EngineOverloadedError, NoEngineError
from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.request_spec_metrics import PerRequestSpecMetrics
from openinfer.frontend.openai.admin_api import add_admin_routes
from openinfer.frontend.openai.chat_format import ChatFormat
from openinfer.frontend.openai.chat_request import parse_chat_request
from openinfer.frontend.openai.completion_format import CompletionFormat
from openinfer.frontend.openai.completion_request import parse_completion_request
from openinfer.frontend.openai.errors import ApiError, engine_failed, invalid_request, no_engine, overloaded
from openinfer.frontend.openai.generation import CompletionDelta, EngineRequestError, Generation
from openinfer.frontend.openai.response_format import ResponseFormat, ResponseIds
from openinfer.frontend.openai.sampling_options import SamplingOptions

logger = logging.getLogger(__name__)

# Routes that answer without an API key: probes and Prometheus scrapes.
_OPEN_PATHS = frozenset({"/health", "/metrics"})
# Prompts given as text or token ids can be long; aiohttp's default body limit is 1 MiB.
_MAX_BODY_BYTES = 64 * 1024 * 1024
# A request's id: the client's X-Request-Id when it sends one, else a fresh one; echoed in the response.
REQUEST_ID_HEADER = "X-Request-Id"
_MAX_REQUEST_ID_CHARS = 256

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(
    client: EngineClient,
    metrics: FrontendMetrics,
    api_key: str | None = None,
    per_request_spec_metrics: PerRequestSpecMetrics = PerRequestSpecMetrics.SUMMARY,
    drafter_timeout: float = 120.0,
) -> web.Application:
    """The aiohttp application; with ``api_key`` every route but /health and /metrics needs the Bearer key.

    ``per_request_spec_metrics`` says what a request's final response tells of its speculative decoding;
    ``drafter_timeout`` is how long the admin drafter routes wait for the engine's reply.
    """
    api = _OpenAIApi(client, metrics, per_request_spec_metrics)
    app = web.Application(
        middlewares=[_error_middleware, _request_id_middleware, _auth_middleware(api_key)],
        client_max_size=_MAX_BODY_BYTES,
    )
    app.on_response_prepare.append(_echo_request_id)
    app.router.add_get("/health", api.health)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/v1/models", api.models)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    add_admin_routes(app, client, drafter_timeout)
    return app


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve ``app`` (port 0: any free port, see ``runner.addresses``); stop with ``runner.cleanup()``.

    Handlers are cancelled when their client disconnects, which aborts the request on its engine.
    """
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=5.0, access_log_class=_QuietAccessLogger
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


class _QuietAccessLogger(AbstractAccessLogger):
    """Access log without the probes: /health and /metrics are polled every few hundred ms."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if request.path in ("/health", "/metrics"):
            return
        identity = request.get(_REQUEST_IDENTITY)
        self.logger.info(
            '%s "%s %s" %d %.3fs request_id=%s',
            request.remote,
            request.method,
            request.path_qs,
            response.status,
            time,
            identity.request_id if identity is not None else "-",
        )


class _OpenAIApi:
    """The route handlers, sharing the engine client and the metrics."""

    def __init__(
        self, client: EngineClient, metrics: FrontendMetrics, spec_metrics: PerRequestSpecMetrics
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._spec_metrics = spec_metrics

    async def health(self, request: web.Request) -> web.Response:
        """200 once at least one engine is up, else 503."""
        num_up = self._client.num_engines_up
        if num_up == 0:
            raise no_engine("no engine is up")
        return web.json_response({"status": "ok", "engines_up": num_up})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

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
            for model in self._client.served_models()
        ]
        return _json({"object": "list", "data": data})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's completions endpoint, streaming (SSE) or not."""
        arrival = time.monotonic()
        completion = parse_completion_request(await request.read())
        model = self._model(completion.model)
        ids = _response_ids(request, "cmpl", model)
        engine_request = completion.to_engine_request(model, _engine_request_id(request, ids))
        fmt = CompletionFormat(
            ids, model.tokenizer, engine_request.prompt_token_ids, completion.options.return_token_ids
        )
        generation = Generation(
            self._client, self._metrics, model, engine_request, completion.options, arrival
        )
        return await self._respond(request, generation, completion.options, fmt)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's chat completions endpoint: the messages through the model's chat template."""
        arrival = time.monotonic()
        chat = parse_chat_request(await request.read())
        model = self._model(chat.model)
        ids = _response_ids(request, "chatcmpl", model)
        engine_request = chat.to_engine_request(model, _engine_request_id(request, ids))
        fmt = ChatFormat(ids, model.tokenizer, engine_request.prompt_token_ids, chat.options.return_token_ids)
        generation = Generation(self._client, self._metrics, model, engine_request, chat.options, arrival)
        return await self._respond(request, generation, chat.options, fmt)

    def _model(self, name: str | None) -> ServedModel:
        """The model a request names, or the first served one; 503 if no engine is up, 404 if unknown."""
        served = self._client.served_models()
        if not served:
            raise no_engine("no engine is up; retry when /health answers 200")
        model = served[0] if name is None else self._client.served_model(name)
        if model is None:
            served_names = ", ".join(m.name for m in served)
            message = f"The model `{name}` does not exist; this server serves: {served_names}."
            raise ApiError(404, message, param="model", code="model_not_found")
        return model

    async def _respond(
        self, request: web.Request, generation: Generation, options: SamplingOptions, fmt: ResponseFormat
    ) -> web.StreamResponse:
        try:
            async with generation:
                if options.stream:
                    return await self._stream(request, generation, options, fmt)
                return await self._complete(generation, fmt)
        except NoEngineError as e:
            raise no_engine(str(e)) from None

    async def _complete(self, generation: Generation, fmt: ResponseFormat) -> web.Response:
        deltas: list[CompletionDelta] = []
        try:
            async for delta in generation.deltas():
                deltas.append(delta)
        except EngineRequestError as e:
            logger.warning("request %s failed on its engine: %s", generation.request_id, e)
            raise engine_failed(str(e)) from None
        assert deltas and deltas[-1].finish_reason is not None
        body = fmt.response(deltas)
        body["usage"] = _usage(generation)
        self._add_spec_metrics(body, deltas[-1])
        return _json(body)

    async def _stream(
        self, request: web.Request, generation: Generation, options: SamplingOptions, fmt: ResponseFormat
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            async with aclosing(self._stream_events(generation, options, fmt)) as events:
                async for event in events:
                    await response.write(_sse(event))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:  # the client went away; leaving the generation aborts it on the engine
            logger.info("the client of request %s disconnected mid-stream", generation.request_id)
        return response

    async def _stream_events(
        self, generation: Generation, options: SamplingOptions, fmt: ResponseFormat
    ) -> AsyncGenerator[dict[str, Any]]:
        """The endpoint's chunks, then the usage chunk if asked; an engine error becomes an error event."""
        try:
            async for delta in generation.deltas():
                chunks = fmt.chunks(delta)
                if chunks and delta.finish_reason is not None:
                    self._add_spec_metrics(chunks[-1], delta)  # on the chunk with finish_reason
                for chunk in chunks:
                    if options.include_usage:
                        chunk["usage"] = None  # as OpenAI: every chunk has it, only the last one fills it
                    yield chunk
            if options.include_usage:
                chunk = fmt.usage_chunk()
                chunk["usage"] = _usage(generation)
                yield chunk
        except EngineRequestError as e:
            logger.warning("request %s failed on its engine: %s", generation.request_id, e)
            yield engine_failed(str(e)).body()

    def _add_spec_metrics(self, body: dict[str, Any], delta: CompletionDelta) -> None:
        """Put the request's spec-decode metrics on its final response or chunk, if it has any."""
        metrics = self._spec_metrics.response_metrics(delta.spec_stats)
        if metrics is not None:
            body["metrics"] = metrics


@dataclass(frozen=True)
class _RequestIdentity:
    """The id of one HTTP request, for its response, its log lines and its engine request."""

    request_id: str
    from_client: bool  # given in the X-Request-Id header (so it may be reused; engine ids get a suffix)


_REQUEST_IDENTITY = web.RequestKey("openinfer_request_identity", _RequestIdentity)


def _response_ids(request: web.Request, prefix: str, model: ServedModel) -> ResponseIds:
    """The response's id is the request id behind the endpoint's prefix (vLLM's "cmpl-" / "chatcmpl-")."""
    return ResponseIds(f"{prefix}-{request[_REQUEST_IDENTITY].request_id}", int(time.time()), model.name)


def _engine_request_id(request: web.Request, ids: ResponseIds) -> str:
    """The id the engine runs the request under: the response id, plus a random suffix when the client
    chose the request id, since two requests in flight may carry the same one."""
    if request[_REQUEST_IDENTITY].from_client:
        return f"{ids.id}-{uuid.uuid4().hex[:8]}"
    return ids.id


def _usage(generation: Generation) -> dict[str, int]:
    prompt, completion = generation.num_prompt_tokens, generation.num_output_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json(body: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _sse(event: object) -> bytes:
    return b"data: " + msgspec.json.encode(event) + b"\n\n"


@web.middleware
async def _request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request's id: the client's X-Request-Id (1 to 256 visible ASCII characters), or a new one."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None:
        request[_REQUEST_IDENTITY] = _RequestIdentity(uuid.uuid4().hex, from_client=False)
    elif 0 < len(given) <= _MAX_REQUEST_ID_CHARS and all("!" <= c <= "~" for c in given):
        request[_REQUEST_IDENTITY] = _RequestIdentity(given, from_client=True)
    else:
        raise invalid_request(
            f"the {REQUEST_ID_HEADER} header must be 1 to {_MAX_REQUEST_ID_CHARS} visible ASCII characters "
            "(no spaces)"
        )
    return await handler(request)


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every response carries its request's id (errors and streams too), set just before headers go out."""
    identity = request.get(_REQUEST_IDENTITY)
    if identity is not None:
        response.headers[REQUEST_ID_HEADER] = identity.request_id


@web.middleware
async def _error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as an OpenAI error body, including aiohttp's own (404 route, 405, 413)."""
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except EngineOverloadedError as e:  # from any route that adds requests: 503 + Retry-After
        return overloaded(str(e), e.retry_after_s).response()
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _http_error(request, e)
    except Exception:  # noqa: BLE001 - a bug must still answer in OpenAI's shape
        identity = request.get(_REQUEST_IDENTITY)
        request_id = identity.request_id if identity is not None else "-"
        logger.exception("error while serving %s %s (request %s)", request.method, request.path, request_id)
        return ApiError(500, "internal server error; see the frontend's log", type_="server_error").response()


def _http_error(request: web.Request, error: web.HTTPException) -> web.Response:
    """aiohttp's own errors in OpenAI's shape, saying what to do; 405 keeps its Allow header."""
    route = f"{request.method} {request.path}"
    if error.status == 404:
        message = f"no route {route}; openinfer serves /v1/completions, /v1/chat/completions, /v1/models"
        response = ApiError(404, message, code="not_found").response()
    elif error.status == 405:
        allowed = error.headers.get("Allow", "")
        message = (
            f"method {request.method} is not allowed on {request.path}; use {allowed or 'another method'}"
        )
        response = ApiError(405, message, code="method_not_allowed").response()
        if allowed:
            response.headers["Allow"] = allowed
    elif error.status == 413:
        message = f"the request body exceeds {_MAX_BODY_BYTES} bytes"
        response = ApiError(413, message, code="request_too_large").response()
    else:
        response = ApiError(error.status, f"{route}: {error.reason}").response()
    return response


def _auth_middleware(api_key: str | None) -> Middleware:
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if api_key is not None and request.path not in _OPEN_PATHS:
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                raise ApiError(
                    401,
                    "Incorrect or missing API key: send the server's key as `Authorization: Bearer KEY`.",
                    code="invalid_api_key",
                )
        return await handler(request)

    return auth
