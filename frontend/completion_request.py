"""A ``POST /v1/completions`` body, validated into the typed request the API server runs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

from openinfer.frontend.api_error import invalid_request
from openinfer.frontend.engine_registry import ServedModel
from openinfer.protocol import EngineCoreRequest, SamplingParams

# OpenAI / vLLM parameters openinfer does not support yet, with the values that mean "not used":
# any other value is refused rather than silently ignored.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "logprobs": (None,),
    "prompt_logprobs": (None,),
    "suffix": (None, ""),
    "stop": (None, "", []),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "min_tokens": (None, 0),
}


@dataclass(frozen=True)
class CompletionRequest:
    """What one completion asks for: OpenAI's parameters openinfer supports, plus vLLM's extensions."""

    prompt: str | list[int]  # text, or token ids
    model: str | None  # None: the first served model
    max_tokens: int | None  # None: as many as the model length leaves
    temperature: float
    top_p: float
    top_k: int | None  # None: the whole vocabulary
    seed: int | None
    stop_token_ids: list[int]
    ignore_eos: bool
    skip_special_tokens: bool
    return_token_ids: bool  # vLLM extension: token ids in each choice
    stream: bool
    include_usage: bool  # stream_options.include_usage: a final usage chunk

    def to_engine_request(self, model: ServedModel, request_id: str) -> EngineCoreRequest:
        """Tokenize and bound the request for ``model``: prompt + output never exceed its max_model_len.

        EOS is not passed: the engine knows its EOS ids and honours ``ignore_eos``.
        """
        if isinstance(self.prompt, str):
            prompt_token_ids = model.tokenizer.encode(self.prompt)
        else:
            prompt_token_ids = self.prompt
        for name, ids in (("prompt", prompt_token_ids), ("stop_token_ids", self.stop_token_ids)):
            if any(token_id >= model.vocab_size for token_id in ids):
                raise invalid_request(
                    f"`{name}` holds a token id >= the vocabulary size {model.vocab_size}", name
                )
        room = model.max_model_len - len(prompt_token_ids)
        if room <= 0:
            raise invalid_request(
                f"this model's maximum context length is {model.max_model_len} tokens and the prompt has "
                f"{len(prompt_token_ids)}, which leaves no room for output: shorten the prompt",
                param="prompt",
            )
        max_tokens = room if self.max_tokens is None else min(self.max_tokens, room)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
        )
        return EngineCoreRequest(request_id, prompt_token_ids, params, arrival_time=time.time())


def parse_completion_request(body: bytes) -> CompletionRequest:
    """Decode and validate a request body; raise :class:`ApiError` (400) naming the bad parameter."""
    try:
        fields = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise invalid_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(fields, dict):
        raise invalid_request("the request body must be a JSON object")
    for name, neutral in _UNSUPPORTED.items():
        if name in fields and not any(_same(fields[name], value) for value in neutral):
            raise invalid_request(f"`{name}` is not supported by openinfer yet", param=name)

    stream = _bool(fields, "stream", False)
    stream_options = fields.get("stream_options")
    if stream_options is not None and not stream:
        raise invalid_request("`stream_options` needs `stream: true`", param="stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise invalid_request("`stream_options` must be an object", param="stream_options")

    max_tokens = _int(fields, "max_tokens", 16)
    if max_tokens is not None and max_tokens <= 0:
        raise invalid_request(f"`max_tokens` must be at least 1, got {max_tokens}", param="max_tokens")
    temperature = _number(fields, "temperature", 1.0)
    if temperature < 0:
        raise invalid_request(f"`temperature` must be >= 0, got {temperature}", param="temperature")
    top_p = _number(fields, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise invalid_request(f"`top_p` must be in (0, 1], got {top_p}", param="top_p")
    top_k = _int(fields, "top_k", -1)
    if top_k is not None and top_k < -1:
        raise invalid_request(f"`top_k` must be -1 or 0 (off) or positive, got {top_k}", param="top_k")
    seed = _int(fields, "seed", None)
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise invalid_request("`seed` must fit in 64 bits", param="seed")
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_request("`model` must be a string", param="model")

    return CompletionRequest(
        prompt=_prompt(fields),
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k if top_k is not None and top_k > 0 else None,
        seed=seed,
        stop_token_ids=_token_ids(fields.get("stop_token_ids") or [], "stop_token_ids"),
        ignore_eos=_bool(fields, "ignore_eos", False),
        skip_special_tokens=_bool(fields, "skip_special_tokens", True),
        return_token_ids=_bool(fields, "return_token_ids", False),
        stream=stream,
        include_usage=_bool(stream_options or {}, "include_usage", False),
    )


def _prompt(fields: dict[str, Any]) -> str | list[int]:
    """One prompt: a string, token ids, or a one-element list of either."""
    if "prompt" not in fields or fields["prompt"] is None:
        raise invalid_request("`prompt` is required", param="prompt")
    prompt = fields["prompt"]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > 1:
            raise invalid_request(
                f"got {len(prompt)} prompts; openinfer takes one prompt per request for now", param="prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid_request("`prompt` must not be empty", param="prompt")
        return prompt
    if isinstance(prompt, list):
        if not prompt:
            raise invalid_request("`prompt` must not be empty", param="prompt")
        return _token_ids(prompt, "prompt")
    raise invalid_request(
        "`prompt` must be a string, a list of token ids, or a list of one of those", "prompt"
    )


def _token_ids(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(t) and t >= 0 for t in value):
        raise invalid_request(f"`{name}` must be a list of non-negative integer token ids", param=name)
    return value


def _int(fields: dict[str, Any], name: str, default: int | None) -> int | None:
    value = fields.get(name, default)
    if value is not None and not _is_int(value):
        raise invalid_request(f"`{name}` must be an integer", param=name)
    return value


def _number(fields: dict[str, Any], name: str, default: float) -> float:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_request(f"`{name}` must be a number", param=name)
    return float(value)


def _bool(fields: dict[str, Any], name: str, default: bool) -> bool:
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(f"`{name}` must be true or false", param=name)
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _same(value: object, neutral: object) -> bool:
    """Equal and of the same kind (``True`` is not ``1`` here, and ``0.0`` is ``0``)."""
    if isinstance(value, bool) != isinstance(neutral, bool):
        return False
    return value == neutral
