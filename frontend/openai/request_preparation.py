"""A parsed completion or chat made into what it runs as on one model: the one place a request's prompt
becomes token ids, shared by the generation routes and their render routes (which must give the same ids)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.chat_request import ChatRequest
from openinfer.frontend.openai.completion_request import INLINE_PROMPT_CHARS, CompletionRequest
from openinfer.frontend.openai.prepared_request import PreparedRequest
from openinfer.frontend.openai.template_pool import ChatTemplatePool


async def prepare_request(
    parsed: CompletionRequest | ChatRequest, model: ServedModel, request_id: str, templates: ChatTemplatePool
) -> PreparedRequest:
    """``parsed`` prepared for ``model`` as engine request ``request_id``: a chat's messages rendered by the
    model's template (in a worker process), the prompt tokenized (in a thread when long) and bounded."""
    prepare: Callable[[ServedModel, str], PreparedRequest]
    if isinstance(parsed, ChatRequest):
        prompt = await parsed.render(model, templates)
        prepare, long = functools.partial(parsed.prepare, prompt=prompt), len(prompt) > INLINE_PROMPT_CHARS
    else:
        prepare, long = parsed.prepare, parsed.prepares_off_loop
    # a long prompt to tokenize: not on the loop
    return await asyncio.to_thread(prepare, model, request_id) if long else prepare(model, request_id)
