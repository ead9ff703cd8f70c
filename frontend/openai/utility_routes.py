"""vLLM's utility routes: ``POST /tokenize``, ``POST /detokenize`` and ``GET /version``, in vLLM 0.32's
request and response shapes (its ``entrypoints/serve/tokenize/protocol.py`` and ``serving.py``).

/tokenize takes a text (``prompt``) or chat ``messages``, and its token ids are those the generation
endpoints would send to an engine for the same input: a text is tokenized as /v1/completions tokenizes it,
messages are rendered by :meth:`ChatTemplatePool.render`, as /v1/chat/completions renders them. As in vLLM, a
body with ``messages`` is a chat whatever else it holds, and neither form is bounded by the model's context
(counting a prompt that does not fit is what a client may want). Unlike vLLM, whose API key guards only
paths under /v1, all three routes need the key where one is set, as every route but /health and /metrics
does: they tell who calls them about the served models and the server.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from aiohttp import web

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.body.decode import decode_body, refuse_unsupported
from openinfer.frontend.openai.chat_messages import template_messages
from openinfer.frontend.openai.chat_request import TEMPLATE_UNSUPPORTED
from openinfer.frontend.openai.chat_tools import parse_tools
from openinfer.frontend.openai.completion_request import INLINE_PROMPT_CHARS
from openinfer.frontend.openai.errors import ApiError
from openinfer.frontend.openai.template_pool import ChatTemplatePool

# The ids a tokenizer can hold: vLLM's tokenizer (Rust, 32-bit ids) answers a larger one with a 400, and
# decodes an id within this range that its vocabulary lacks as "" (so does ours).
MAX_TOKEN_ID = 2**32 - 1
TokenId32 = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]
# Token ids up to this many are decoded on the event loop, more in a thread.
INLINE_DETOKENIZE_TOKENS = 4096

_TYPE_MESSAGES = {
    "prompt": "`prompt` must be a string: the text to tokenize",
    "tokens": f"`tokens` must be a list of token ids (integers in [0, {MAX_TOKEN_ID}])",
}

ReadBody = Callable[[web.Request], Awaitable[bytes]]
FindModel = Callable[[str | None], ServedModel]


class TokenizeBody(msgspec.Struct):
    """The JSON body of ``POST /tokenize``: vLLM's completion form (``prompt``) or chat form (``messages``
    and the template's fields); null means the default, as absent does."""

    model: str | None = None  # None: the first served model
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None  # as /v1/chat/completions takes them
    add_special_tokens: bool | None = None  # default: true for a prompt (BOS, ...), false for messages
    return_token_strs: bool | None = None  # default false: token_strs is null
    add_generation_prompt: bool | None = None  # default true
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Any = None  # checked by parse_tools, which names the bad part
    # Refused unless neutral (TEMPLATE_UNSUPPORTED), as /v1/chat/completions refuses them
    continue_final_message: Any = None
    chat_template: Any = None


class DetokenizeBody(msgspec.Struct):
    """The JSON body of ``POST /detokenize``."""

    tokens: list[TokenId32]
    model: str | None = None  # None: the first served model


@dataclass(frozen=True)
class TokenizeRequest:
    """What one /tokenize asks for: a text to tokenize, or chat messages to render and tokenize."""

    model: str | None  # None: the first served model
    prompt: str | None  # the completion form's text; None for the chat form
    messages: list[dict[str, Any]]  # the chat form's, validated by template_messages ([] for a text)
    add_generation_prompt: bool
    template_kwargs: dict[str, Any]  # vLLM's chat_template_kwargs
    tools: list[dict[str, Any]] | None  # rendered by the template, as chat renders them
    add_special_tokens: bool
    return_token_strs: bool

    async def token_ids(self, model: ServedModel, templates: ChatTemplatePool) -> list[int]:
        """The prompt token ids the generation endpoint of this form would send to ``model``'s engine: its
        text, or the messages rendered by ``model``'s chat template, tokenized (in a thread when long)."""
        text = self.prompt
        if text is None:
            text = await templates.render(
                model, self.messages, self.add_generation_prompt, self.template_kwargs, self.tools
            )
        encode = functools.partial(model.tokenizer.encode, text, add_special_tokens=self.add_special_tokens)
        return await asyncio.to_thread(encode) if len(text) > INLINE_PROMPT_CHARS else encode()


def parse_tokenize_request(body: bytes) -> TokenizeRequest:
    """Decode and validate a /tokenize body; raise :class:`ApiError` (400) naming the bad parameter."""
    tokenize = decode_body(body, TokenizeBody, _TYPE_MESSAGES)
    if tokenize.messages is not None:  # vLLM's union picks its chat form whenever messages are given
        refuse_unsupported(tokenize, TEMPLATE_UNSUPPORTED)
        return TokenizeRequest(
            model=tokenize.model,
            prompt=None,
            messages=template_messages(tokenize.messages),
            add_generation_prompt=tokenize.add_generation_prompt is not False,
            template_kwargs=tokenize.chat_template_kwargs or {},
            tools=parse_tools(tokenize.tools),
            add_special_tokens=tokenize.add_special_tokens is True,
            return_token_strs=tokenize.return_token_strs is True,
        )
    if tokenize.prompt is None:
        raise ApiError(
            400,
            "Missing required parameter: 'prompt' (a text to tokenize) or 'messages' (a chat to render "
            "with the model's chat template and tokenize).",
            param="prompt",
            code="missing_required_parameter",
        )
    return TokenizeRequest(
        model=tokenize.model,
        prompt=tokenize.prompt,
        messages=[],
        add_generation_prompt=True,
        template_kwargs={},
        tools=None,
        add_special_tokens=tokenize.add_special_tokens is not False,
        return_token_strs=tokenize.return_token_strs is True,
    )


def add_utility_routes(
    app: web.Application, read_body: ReadBody, find_model: FindModel, templates: ChatTemplatePool
) -> None:
    """Serve /tokenize, /detokenize and /version on ``app``. ``read_body``: a request's body, within the
    served models' bounds (503 while no engine is up: the tokenizers come from the engines' hellos);
    ``find_model``: the served model a request names (404 for an unknown one); ``templates``: where chat
    messages are rendered."""
    routes = _UtilityRoutes(read_body, find_model, templates, package_version())
    app.router.add_post("/tokenize", routes.tokenize)
    app.router.add_post("/detokenize", routes.detokenize)
    app.router.add_get("/version", routes.version)


def package_version() -> str:
    """openinfer's installed version; "unknown" for sources that were never installed (no metadata)."""
    try:
        return importlib.metadata.version("openinfer")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, eq=False)  # handlers compare and hash by identity
class _UtilityRoutes:
    """The handlers, sharing the API's body reader and model lookup."""

    read_body: ReadBody
    find_model: FindModel
    templates: ChatTemplatePool
    server_version: str

    async def tokenize(self, request: web.Request) -> web.Response:
        """``{"count", "max_model_len", "tokens", "token_strs"}``; ``token_strs`` (the tokens as the
        vocabulary spells them) is null unless ``return_token_strs``."""
        tokenize = parse_tokenize_request(await self.read_body(request))
        model = self.find_model(tokenize.model)
        tokens = await tokenize.token_ids(model, self.templates)
        token_strs = None
        if tokenize.return_token_strs:
            token_strs = [model.tokenizer.token_piece(t) for t in tokens]
        body = {
            "count": len(tokens),
            "max_model_len": model.max_model_len,
            "tokens": tokens,
            "token_strs": token_strs,
        }
        return _json(body)

    async def detokenize(self, request: web.Request) -> web.Response:
        """``{"prompt": text}``: the tokens' text with special tokens written out (as vLLM decodes them);
        an id the vocabulary lacks adds nothing."""
        detokenize = decode_body(await self.read_body(request), DetokenizeBody, _TYPE_MESSAGES)
        tokenizer = self.find_model(detokenize.model).tokenizer
        if len(detokenize.tokens) > INLINE_DETOKENIZE_TOKENS:
            text = await asyncio.to_thread(tokenizer.decode, detokenize.tokens, skip_special_tokens=False)
        else:
            text = tokenizer.decode(detokenize.tokens, skip_special_tokens=False)
        return _json({"prompt": text})

    async def version(self, request: web.Request) -> web.Response:
        """``{"version": "..."}``: openinfer's package version."""
        return _json({"version": self.server_version})


def _json(body: object) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")
