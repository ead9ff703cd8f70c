"""A model's chat template rendered in a worker process of
:class:`~openinfer.frontend.openai.template_pool.ChatTemplatePool` (``python -m`` this module), bounded in
memory by its address space and in time by the pool's deadline: a template is code from the model's files,
and jinja2's sandbox bounds neither (``{% for i in range(99999) %}{% for j in range(99999) %}`` runs for
hours, ``{{ 'x' * 8000000000 }}`` allocates 8 GB).

A worker (:func:`~openinfer.frontend.openai.worker_pool.serve_lines`) reads one :class:`RenderJob` per line
(JSON) and answers each with one :data:`RenderReply`. The messages cross as JSON, which is how they came:
the template sees the same values, and renders the same text, as in the frontend's process.
"""

from __future__ import annotations

from typing import Any

import msgspec

from openinfer.frontend.openai.chat_template import ChatTemplateError, compile_chat_template
from openinfer.frontend.openai.worker_pool import serve_lines

# A worker's address space: itself about 30 MB, the largest valid render (a Qwen3 context of 5.2 M characters,
# its messages and its JSON reply) a few hundred MB more.
MAX_MEMORY_BYTES = 1 << 30


class RenderJob(msgspec.Struct, frozen=True):
    """One render: the template's source and what :meth:`ChatTemplate.render` takes."""

    source: str
    messages: list[dict[str, Any]]
    special_tokens: dict[str, Any]
    add_generation_prompt: bool
    template_kwargs: dict[str, Any]
    tools: list[dict[str, Any]] | None
    max_chars: int  # a longer prompt is answered by its length alone (TooLong): the model cannot take it


class Rendered(msgspec.Struct, frozen=True, tag=True):
    """The prompt text."""

    prompt: str


class TooLong(msgspec.Struct, frozen=True, tag=True):
    """A prompt of more than the job's ``max_chars`` characters: this many."""

    num_chars: int


class Refused(msgspec.Struct, frozen=True, tag=True):
    """The template refused the messages (its raise_exception), or failed on them: the client's 400."""

    message: str


class Broken(msgspec.Struct, frozen=True, tag=True):
    """The template does not compile, or crashed (a recursion without end): the model's fault, a 500."""

    message: str


class OutOfMemory(msgspec.Struct, frozen=True, tag=True):
    """The render needed more than :data:`MAX_MEMORY_BYTES`: the model's fault, a 500."""


RenderReply = Rendered | TooLong | Refused | Broken | OutOfMemory


def render(job: RenderJob) -> RenderReply:
    """What the job's template makes of its messages."""
    try:
        template = compile_chat_template(job.source)
    except ChatTemplateError as e:
        return Broken(str(e))
    try:
        prompt = template.render(
            job.messages, job.special_tokens, job.add_generation_prompt, job.template_kwargs, job.tools
        )
    except ChatTemplateError as e:
        return Refused(str(e))
    except MemoryError:
        return OutOfMemory()
    except Exception as e:  # noqa: BLE001 - RecursionError and the like: the template's, not the worker's
        return Broken(f"the chat template failed on the messages: {e!r}")
    if len(prompt) > job.max_chars:
        return TooLong(len(prompt))
    return Rendered(prompt)


def main() -> None:
    """Answer render jobs from stdin until it closes, within :data:`MAX_MEMORY_BYTES`; warm means jinja2 has
    compiled and rendered a template."""
    decoder = msgspec.json.Decoder(RenderJob)
    warm_up = RenderJob("{{ messages[0]['content'] }}", [{"content": "hi"}], {}, True, {}, None, 2)

    def answer(line: bytes) -> bytes:
        try:
            return msgspec.json.encode(render(decoder.decode(line)))
        except MemoryError:  # decoding the job, or encoding a reply within max_chars
            return msgspec.json.encode(OutOfMemory())

    serve_lines(answer, warm=lambda: render(warm_up), max_memory_bytes=MAX_MEMORY_BYTES)


if __name__ == "__main__":
    main()
