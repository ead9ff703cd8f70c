"""Chat templates render as transformers' apply_chat_template renders them, token for token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from openinfer.frontend.openai.chat_template import ChatTemplateError, compile_chat_template
from openinfer.frontend.tokenizer import Tokenizer
from tests.frontend.openai.chat_templates import CONVERSATIONS, QWEN_STYLE

BUILTIN = Path(__file__).parents[3] / "engine_core" / "builtin"


@pytest.fixture(scope="module")
def hf_tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(BUILTIN)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(
        (BUILTIN / "tokenizer.json").read_bytes(), (BUILTIN / "tokenizer_config.json").read_bytes()
    )


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_same_text_and_tokens_as_transformers(
    hf_tokenizer: PreTrainedTokenizerFast,
    tokenizer: Tokenizer,
    messages: list[dict[str, object]],
    kwargs: dict[str, object],
    add_generation_prompt: bool,
) -> None:
    """Our rendering and tokenization equal apply_chat_template's, text and ids."""
    ours = compile_chat_template(QWEN_STYLE).render(
        messages, tokenizer.special_tokens, add_generation_prompt, kwargs
    )
    theirs = hf_tokenizer.apply_chat_template(
        messages,
        chat_template=QWEN_STYLE,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    assert ours == theirs
    their_ids = hf_tokenizer.apply_chat_template(
        messages,
        chat_template=QWEN_STYLE,
        tokenize=True,
        return_dict=False,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    assert tokenizer.encode(ours, add_special_tokens=False) == list(their_ids)


def test_builtin_template_matches_transformers(
    hf_tokenizer: PreTrainedTokenizerFast, tokenizer: Tokenizer
) -> None:
    """The built-in tokenizer's ChatML template renders as transformers renders it."""
    assert tokenizer.chat_template is not None
    messages = CONVERSATIONS[1]
    ours = compile_chat_template(tokenizer.chat_template).render(messages, tokenizer.special_tokens)
    assert ours == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_raise_exception_becomes_a_chat_template_error(tokenizer: Tokenizer) -> None:
    """A template's raise_exception is a ChatTemplateError carrying the template's own message."""
    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="the system message must come first"):
        compile_chat_template(QWEN_STYLE).render(messages, tokenizer.special_tokens)


def test_templates_are_sandboxed(tokenizer: Tokenizer) -> None:
    """A template cannot reach Python internals (jinja2's immutable sandbox, as in transformers)."""
    template = "{{ messages.__class__.__mro__ }}{{ messages.append(1) }}"
    with pytest.raises(ChatTemplateError):
        compile_chat_template(template).render([], {})


def test_bad_template_does_not_compile() -> None:
    """A template with a syntax error is refused when compiled, with jinja2's reason."""
    with pytest.raises(ChatTemplateError, match="does not compile"):
        compile_chat_template("{% for %}")


def test_generation_tag_and_json_helpers() -> None:
    """transformers' {% generation %} block renders its body; tojson keeps non-ASCII characters."""
    template = "{% generation %}{{ messages[0] | tojson }}{% endgeneration %}"
    assert compile_chat_template(template).render([{"content": "é"}], {}) == json.dumps(
        {"content": "é"}, ensure_ascii=False
    )
