"""A model's chat template, rendered with jinja2 exactly as transformers' ``apply_chat_template`` does."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template does not compile, or refused these messages (its ``raise_exception``); the message
    says which, in the template's own words where it has them."""


class ChatTemplate:
    """One compiled template. Use :func:`compile_chat_template`, which caches them by source."""

    def __init__(self, source: str) -> None:
        # transformers' environment: sandboxed, trim_blocks + lstrip_blocks, loop controls, {% generation %},
        # and the helpers templates call (raise_exception, strftime_now, tojson without ASCII escaping).
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the model's chat template does not compile: {e}") from None

    def render(
        self,
        messages: list[dict[str, Any]],
        special_tokens: dict[str, object],
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text for ``messages``.

        The template sees ``messages``, ``add_generation_prompt``, ``tools`` (OpenAI's tool objects, or
        None) and ``documents`` (None), the named special tokens (``bos_token``, ``eos_token``, ...) and
        ``template_kwargs`` (vLLM's ``chat_template_kwargs``, e.g. ``enable_thinking``), as transformers
        passes them.
        """
        context: dict[str, Any] = {
            **special_tokens,
            **(template_kwargs or {}),
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template refused the messages: {e.message or e}") from None
        except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as e:
            raise ChatTemplateError(f"the chat template failed on the messages: {e}") from None


@functools.lru_cache(maxsize=16)
def compile_chat_template(source: str) -> ChatTemplate:
    """The compiled template for ``source``; compiling a big template takes a few milliseconds."""
    return ChatTemplate(source)


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text): renders the body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)
