"""Chat templates rendered in worker processes, bounded in time and memory: a model's template is code, and
one that loops for hours or allocates gigabytes holds up neither the event loop nor a thread, and never
the frontend's memory."""

from __future__ import annotations

from typing import Any, assert_never

import msgspec

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.context_limits import max_prompt_chars, too_many_chars
from openinfer.frontend.openai.errors import ApiError, invalid_request, overloaded
from openinfer.frontend.openai.template_worker import (
    MAX_MEMORY_BYTES,
    Broken,
    OutOfMemory,
    Refused,
    Rendered,
    RenderJob,
    RenderReply,
    TooLong,
)
from openinfer.frontend.openai.worker_pool import AnswerTimeout, WorkerFailed, WorkerPool, WorkersBusy

MAX_WORKERS = 2  # renders at once (a normal chat's takes about 0.1 ms); more wait their turn
_RETRY_AFTER_S = 1
_FIX = "fix the model's chat template (tokenizer_config.json or chat_template.jinja)"
_REPLY = msgspec.json.Decoder(RenderReply)


class ChatTemplatePool(WorkerPool):
    """Renders (:func:`~openinfer.frontend.openai.template_worker.render`) in up to :data:`MAX_WORKERS` worker
    processes (a :class:`~openinfer.frontend.openai.worker_pool.WorkerPool`), each within ``timeout`` seconds
    and :data:`~openinfer.frontend.openai.template_worker.MAX_MEMORY_BYTES`; one that waits as long for a free
    worker is a 503 (with Retry-After). A worker past its deadline, or whose client left, is killed and
    another takes its place; one is started with the server (:meth:`start`) and kept idle.
    """

    def __init__(self, timeout: float) -> None:
        super().__init__(
            "openinfer.frontend.openai.template_worker", timeout, timeout, MAX_WORKERS, MAX_MEMORY_BYTES
        )

    async def render(
        self,
        model: ServedModel,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any],
        tools: list[dict[str, Any]] | None,
    ) -> str:
        """The prompt text ``model``'s chat template makes of ``messages`` (from
        :func:`~openinfer.frontend.openai.chat_messages.template_messages`): what /v1/chat/completions and the
        chat form of /tokenize tokenize. 400 when the model has no template, when the template refuses the
        messages, or when the prompt is longer than the model's context can be; 500 when the template does
        not compile, takes longer than the deadline, or needs more memory than a worker has; 503 when every
        worker stays busy past the deadline."""
        source = model.tokenizer.chat_template
        if source is None:
            raise invalid_request(
                f"the model `{model.name}` has no chat template (no `chat_template` in its "
                "tokenizer_config.json and no chat_template.jinja), so it cannot take chat messages: use "
                "/v1/completions with a prompt",
                param="messages",
            )
        job = RenderJob(
            source,
            messages,
            model.tokenizer.special_tokens,
            add_generation_prompt,
            template_kwargs,
            tools,
            max_prompt_chars(model),
        )
        reply = await self._render_reply(job)
        match reply:
            case Rendered(prompt):
                return prompt
            case TooLong(num_chars):
                raise too_many_chars(num_chars, "messages", model)
            case Refused(message):
                raise invalid_request(message, param="messages")
            case Broken(message):
                raise _template_fault(f"{message}; {_FIX}")
            case OutOfMemory():
                raise _template_fault(
                    f"the chat template needed more than {MAX_MEMORY_BYTES >> 20} MiB to render these "
                    f"messages; {_FIX}"
                )
        assert_never(reply)

    async def _render_reply(self, job: RenderJob) -> RenderReply:
        try:
            return _REPLY.decode(await self.ask(msgspec.json.encode(job)))
        except WorkersBusy:
            raise overloaded(
                f"every one of the {MAX_WORKERS} workers that render chat templates was busy for "
                f"{self._timeout:g} s; retry later",
                _RETRY_AFTER_S,
            ) from None
        except AnswerTimeout:
            raise _template_fault(
                f"the chat template took more than {self._timeout:g} s to render these messages (the "
                f"server's --chat-template-timeout); {_FIX}",
                code="chat_template_timeout",
            ) from None
        except WorkerFailed:
            raise _template_fault(
                f"the chat template crashed its renderer on these messages; {_FIX}"
            ) from None


def _template_fault(message: str, code: str | None = None) -> ApiError:
    """500: the model's template is at fault, not the request (the client cannot change the template, and
    the same messages render under a sound one)."""
    return ApiError(500, message, type_="server_error", code=code)
