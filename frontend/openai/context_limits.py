"""What fits in a model's context, refused in vLLM's words (vLLM 0.32: ``renderers/params.py``'s
``TokenizeParams`` and ``_text_len_check``, ``entrypoints/serve/utils/api_utils.py``'s ``get_max_tokens``).

- An output bound (``max_tokens``, chat's ``max_completion_tokens``) above ``max_model_len`` is a 400; one
  within it is cut to the room the prompt leaves, and no bound means all of that room (as vLLM).
- A text prompt of more characters than ``max_model_len`` tokens could spell (times the tokenizer's longest
  token) is a 400 before it is tokenized, so a huge prompt costs no tokenizing.
- A prompt of more tokens than ``max_model_len`` is a 400, and so is one that leaves no room for a token.
"""

from __future__ import annotations

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.errors import ApiError, invalid_request


def check_max_tokens(max_tokens: int | None, param: str, model: ServedModel) -> None:
    """400 when the output bound ``param`` asks for more tokens than the model's whole context."""
    if max_tokens is not None and max_tokens > model.max_model_len:
        raise invalid_request(
            f"{param}={max_tokens} cannot be greater than max_model_len={model.max_model_len}. "
            "Please request fewer output tokens.",
            param,
        )


def max_prompt_chars(model: ServedModel) -> int:
    """The most characters a text prompt that fits ``model``'s context can have: ``max_model_len`` tokens of
    the tokenizer's longest spelling (in bytes for byte-level vocabularies: one character per byte)."""
    return model.max_model_len * model.tokenizer.max_chars_per_token


def check_prompt_chars(text: str, param: str, model: ServedModel) -> None:
    """400, before tokenizing, for a text that cannot fit in the context whatever its tokens."""
    if len(text) > max_prompt_chars(model):
        raise too_many_chars(len(text), param, model)


def too_many_chars(num_chars: int, param: str, model: ServedModel) -> ApiError:
    """The 400 of a prompt of ``num_chars`` characters, more than :func:`max_prompt_chars`."""
    max_model_len = model.max_model_len
    return invalid_request(
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
        f"{num_chars} characters (more than {max_prompt_chars(model)} characters, which is the upper bound "
        f"for {max_model_len} input tokens). Please reduce the length of the input prompt.",
        param,
    )


def output_room(num_prompt_tokens: int, param: str, model: ServedModel) -> int:
    """The output tokens a prompt of ``num_prompt_tokens`` leaves room for (at least 1); else 400."""
    max_model_len = model.max_model_len
    head = f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains"
    if num_prompt_tokens > max_model_len:
        raise invalid_request(
            f"{head} {num_prompt_tokens} input tokens, which exceeds this limit even without any output "
            "tokens. Please reduce the length of the input prompt.",
            param,
        )
    if num_prompt_tokens == max_model_len:
        raise invalid_request(
            f"{head} {num_prompt_tokens} input tokens, which leaves no room for output tokens (at least 1). "
            "Please reduce the length of the input prompt.",
            param,
        )
    return max_model_len - num_prompt_tokens
