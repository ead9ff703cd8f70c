"""vLLM's render routes: ``POST /v1/completions/render`` and ``POST /v1/chat/completions/render`` answer the
prompt token ids a completion or chat body would run as, without running it.

vllm-router's ``kv_aware`` policy posts each request's body to the render route of every node, then matches the
token ids against the blocks each node's KV events say it holds. The ids are made by the very code the
generation routes run (:func:`~openinfer.frontend.openai.request_preparation.prepare_request`): the body is
parsed as they parse it (the keys routers add to it included), a chat rendered by the model's template, the
prompt tokenized and checked against the model's context. So a body either route refuses is refused here too,
with the same error. The response shapes are vLLM's (a list of ``GenerateRequest`` for completions, one for a
chat); ``sampling_params`` is left empty (routers read only ``token_ids``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.chat_request import ChatRequest, parse_chat_request
from openinfer.frontend.openai.completion_request import CompletionRequest, parse_completion_batch
from openinfer.frontend.openai.middleware import REQUEST_IDENTITY
from openinfer.frontend.openai.parsers.chat_parsers import ChatParsers
from openinfer.frontend.openai.request_preparation import prepare_request
from openinfer.frontend.openai.structured_outputs_config import StructuredOutputsConfig
from openinfer.frontend.openai.template_pool import ChatTemplatePool

ReadBody = Callable[[web.Request], Awaitable[bytes]]
FindModel = Callable[[str | None], ServedModel]


class RenderedRequest(msgspec.Struct):
    """One rendered request, as vLLM's ``GenerateRequest`` spells it (the fields routers read)."""

    request_id: str  # the response id the request would get ("cmpl-..." / "chatcmpl-...")
    token_ids: list[int]  # the prompt token ids its engine would get
    model: str
    sampling_params: dict[str, Any] = {}  # vLLM's; routers do not read them


class RenderedCompletion(RenderedRequest):
    """A completion's rendered prompt; ``token_offsets`` is vLLM's (null: no multimodal placeholders)."""

    token_offsets: None = None


def add_render_routes(
    app: web.Application,
    read_body: ReadBody,
    find_model: FindModel,
    templates: ChatTemplatePool,
    chat_parsers: ChatParsers,
    structured_config: StructuredOutputsConfig,
) -> None:
    """Serve the render routes on ``app``, parsing bodies as the generation routes do (``chat_parsers``,
    ``structured_config``: the server's). ``read_body``: a request's body within the served models' bounds
    (503 while no engine is up); ``find_model``: the served model a request names (404 for an unknown one);
    ``templates``: where chat messages are rendered."""
    routes = _RenderRoutes(read_body, find_model, templates, chat_parsers, structured_config)
    app.router.add_post("/v1/completions/render", routes.completions)
    app.router.add_post("/v1/chat/completions/render", routes.chat)


@dataclass(frozen=True, eq=False)  # handlers compare and hash by identity
class _RenderRoutes:
    """The handlers, sharing the API's body reader, model lookup and template workers."""

    read_body: ReadBody
    find_model: FindModel
    templates: ChatTemplatePool
    chat_parsers: ChatParsers
    structured_config: StructuredOutputsConfig

    async def completions(self, request: web.Request) -> web.Response:
        """A list with one entry per prompt of the body (a batch of several is taken here, which
        /v1/completions refuses: each is rendered as the body with that prompt alone would run); entry i of a
        batch is ``cmpl-<request id>-<i>``."""
        batch = parse_completion_batch(await self.read_body(request), self.structured_config)
        request_id = f"{CompletionRequest.response_prefix}-{request[REQUEST_IDENTITY].request_id}"
        ids = [request_id] if len(batch) == 1 else [f"{request_id}-{i}" for i in range(len(batch))]
        model = self.find_model(batch[0].model)  # the body's, as every prompt's
        rendered = []
        for one, one_id in zip(batch, ids, strict=True):
            rendered.append(RenderedCompletion(one_id, await self._token_ids(one, model, one_id), model.name))
        return _json(rendered)

    async def chat(self, request: web.Request) -> web.Response:
        """One entry: the messages rendered by the model's chat template, tokenized."""
        chat = parse_chat_request(await self.read_body(request), self.chat_parsers, self.structured_config)
        model = self.find_model(chat.model)
        request_id = f"{ChatRequest.response_prefix}-{request[REQUEST_IDENTITY].request_id}"
        return _json(RenderedRequest(request_id, await self._token_ids(chat, model, request_id), model.name))

    async def _token_ids(
        self, parsed: CompletionRequest | ChatRequest, model: ServedModel, request_id: str
    ) -> list[int]:
        prepared = await prepare_request(parsed, model, request_id, self.templates)
        return prepared.engine_request.prompt_token_ids


def _json(body: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")
