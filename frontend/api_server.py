"""The OpenAI-compatible HTTP API: /v1/completions, /v1/models, /health, Prometheus /metrics and /admin."""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from openinfer.frontend.admin_api import add_admin_routes
from openinfer.frontend.api_error import ApiError, engine_failed, no_engine
from openinfer.frontend.completion_request import CompletionRequest, parse_completion_request
from openinfer.frontend.engine_client import EngineClient, NoEngineError
from openinfer.frontend.engine_registry import ServedModel
from openinfer.frontend.generation import CompletionDelta, EngineRequestError, Generation
from openinfer.frontend.metrics import FrontendMetrics
from openinfer.frontend.request_spec_metrics import PerRequestSpecMetrics

logger = logging.getLogger(__name__)

# Routes that answer without an API key: probes and Prometheus scrapes.
_OPEN_PATHS = frozenset({"/health", "/metrics"})
# Prompts given as text or token ids can be long; aiohttp's default body limit is 1 MiB.
_MAX_BODY_BYTES = 64 * 1024 * 1024

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
        middlewares=[_error_middleware, _auth_middleware(api_key)], client_max_size=_MAX_BODY_BYTES
    )
    app.router.add_get("/health", api.health)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/v1/models", api.models)
    app.router.add_post("/v1/completions", api.completions)
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
        self.logger.info(
            '%s "%s %s" %d %.3fs', request.remote, request.method, request.path_qs, response.status, time
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
        request_id = f"cmpl-{uuid.uuid4().hex}"
        engine_request = completion.to_engine_request(model, request_id)
        generation = Generation(
            self._client, self._metrics, model, engine_request, completion.skip_special_tokens, arrival
        )
        shape = _CompletionShape(
            request_id, int(time.time()), model.name, completion.return_token_ids, self._spec_metrics
        )
        try:
            async with generation:
                if completion.stream:
                    return await self._stream(request, completion, generation, shape)
                return await self._complete(generation, shape)
        except NoEngineError as e:
            raise no_engine(str(e)) from None

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

    async def _complete(self, generation: Generation, shape: _CompletionShape) -> web.Response:
        texts: list[str] = []
        token_ids: list[int] = []
        last: CompletionDelta | None = None
        try:
            async for delta in generation.deltas():
                texts.append(delta.text)
                token_ids.extend(delta.token_ids)
                last = delta
        except EngineRequestError as e:
            raise engine_failed(str(e)) from None
        assert last is not None and last.finish_reason is not None
        choice = shape.choice("".join(texts), last.finish_reason, last.stop_reason)
        if shape.return_token_ids:
            choice["prompt_token_ids"] = generation.prompt_token_ids
            choice["token_ids"] = token_ids
        body = shape.chunk([choice])
        body["usage"] = _usage(generation)
        shape.add_spec_metrics(body, last)
        return _json(body)

    async def _stream(
        self,
        request: web.Request,
        completion: CompletionRequest,
        generation: Generation,
        shape: _CompletionShape,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            async with aclosing(_stream_events(completion, generation, shape)) as events:
                async for event in events:
                    await response.write(_sse(event))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:  # the client went away; leaving the generation aborts it on the engine
            logger.info("the client of %s disconnected mid-stream", shape.request_id)
        return response


async def _stream_events(
    completion: CompletionRequest, generation: Generation, shape: _CompletionShape
) -> AsyncGenerator[dict[str, Any]]:
    """OpenAI's completion chunks, then the usage chunk if asked; an engine error becomes an error event."""
    try:
        first = True
        async for delta in generation.deltas():
            if not (delta.text or delta.finish_reason or shape.return_token_ids):
                continue  # text held back until a character completes
            choice = shape.choice(delta.text, delta.finish_reason, delta.stop_reason)
            if shape.return_token_ids:
                if first:
                    choice["prompt_token_ids"] = generation.prompt_token_ids
                choice["token_ids"] = delta.token_ids
            first = False
            chunk = shape.chunk([choice])
            if completion.include_usage:
                chunk["usage"] = None  # as OpenAI: every chunk has it, only the last one fills it
            shape.add_spec_metrics(chunk, delta)  # on the chunk with finish_reason
            yield chunk
        if completion.include_usage:
            chunk = shape.chunk([])
            chunk["usage"] = _usage(generation)
            yield chunk
    except EngineRequestError as e:
        yield engine_failed(str(e)).body()


class _CompletionShape:
    """OpenAI's completion objects for one request: the same id, created time and model in every chunk."""

    def __init__(
        self,
        request_id: str,
        created: int,
        model_name: str,
        return_token_ids: bool,
        spec_metrics: PerRequestSpecMetrics,
    ) -> None:
        self.request_id = request_id
        self.created = created
        self.model_name = model_name
        self.return_token_ids = return_token_ids
        self.spec_metrics = spec_metrics

    def add_spec_metrics(self, body: dict[str, Any], delta: CompletionDelta) -> None:
        """Put the request's spec-decode metrics on its final response or chunk, if it has any."""
        metrics = self.spec_metrics.response_metrics(delta.spec_stats)
        if metrics is not None:
            body["metrics"] = metrics

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model_name,
            "choices": choices,
        }

    def choice(self, text: str, finish_reason: str | None, stop_reason: int | None) -> dict[str, Any]:
        return {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }


def _usage(generation: Generation) -> dict[str, int]:
    prompt, completion = generation.num_prompt_tokens, generation.num_output_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json(body: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _sse(event: object) -> bytes:
    return b"data: " + msgspec.json.encode(event) + b"\n\n"


@web.middleware
async def _error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as an OpenAI error body, including aiohttp's own (404 route, 405, 413)."""
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return ApiError(e.status, e.reason).response()
    except Exception:  # noqa: BLE001 - a bug must still answer in OpenAI's shape
        logger.exception("error while serving %s %s", request.method, request.path)
        return ApiError(500, "internal server error; see the frontend's log", type_="server_error").response()


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
