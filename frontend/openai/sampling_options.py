"""The generation parameters /v1/completions and /v1/chat/completions share, and the engine request."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.errors import invalid_request
from openinfer.frontend.openai.request_fields import read_bool, read_int, read_number, read_token_ids
from openinfer.protocol import EngineCoreRequest, SamplingParams

MAX_STOP_STRINGS = 4  # OpenAI's limit on `stop`
MAX_LOGPROBS = 20  # alternatives per token, at most (OpenAI's chat limit, vLLM's default --max-logprobs)


@dataclass(frozen=True)
class SamplingOptions:
    """How one request samples, stops and reports: OpenAI's parameters plus vLLM's extensions."""

    max_tokens: int | None  # None: as many as the model length leaves
    temperature: float
    top_p: float
    top_k: int | None  # None: the whole vocabulary
    seed: int | None
    stop: tuple[str, ...]  # stop strings, matched in the detokenized output (the engine never sees them)
    include_stop_str_in_output: bool  # vLLM extension: keep the matched stop string in the text
    stop_token_ids: list[int]
    ignore_eos: bool
    skip_special_tokens: bool
    logprobs: int | None  # alternatives per output token the engine reports; None: no logprobs at all
    return_token_ids: bool  # vLLM extension: token ids in each choice
    stream: bool
    include_usage: bool  # stream_options.include_usage: a final usage chunk

    def engine_request(
        self, model: ServedModel, prompt_token_ids: list[int], request_id: str, prompt_param: str = "prompt"
    ) -> EngineCoreRequest:
        """Bound the request for ``model``: prompt + output never exceed its max_model_len.

        EOS is not passed: the engine knows its EOS ids and honours ``ignore_eos``. ``prompt_param`` names
        the field a bad prompt is blamed on ("messages" for chat).
        """
        for name, ids in ((prompt_param, prompt_token_ids), ("stop_token_ids", self.stop_token_ids)):
            if any(token_id >= model.vocab_size for token_id in ids):
                raise invalid_request(
                    f"`{name}` holds a token id >= the vocabulary size {model.vocab_size}", name
                )
        room = model.max_model_len - len(prompt_token_ids)
        if room <= 0:
            raise invalid_request(
                f"this model's maximum context length is {model.max_model_len} tokens and the prompt has "
                f"{len(prompt_token_ids)}, which leaves no room for output: shorten the prompt",
                param=prompt_param,
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
            logprobs=self.logprobs,
        )
        return EngineCoreRequest(request_id, prompt_token_ids, params, arrival_time=time.time())


def parse_sampling_options(
    fields: dict[str, Any], max_tokens_field: str, default_max_tokens: int | None, logprobs: int | None
) -> SamplingOptions:
    """The shared fields of a request body; 400 naming the first bad one.

    ``max_tokens_field`` is where the output bound is read ("max_tokens", or chat's
    "max_completion_tokens"); ``logprobs`` is already read, each endpoint spelling it its own way.
    """
    stream = read_bool(fields, "stream", False)
    stream_options = fields.get("stream_options")
    if stream_options is not None and not stream:
        raise invalid_request("`stream_options` needs `stream: true`", param="stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise invalid_request("`stream_options` must be an object", param="stream_options")

    max_tokens = read_int(fields, max_tokens_field, default_max_tokens)
    if max_tokens is not None and max_tokens <= 0:
        raise invalid_request(
            f"`{max_tokens_field}` must be at least 1, got {max_tokens}", param=max_tokens_field
        )
    temperature = read_number(fields, "temperature", 1.0)
    if temperature < 0:
        raise invalid_request(f"`temperature` must be >= 0, got {temperature}", param="temperature")
    top_p = read_number(fields, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise invalid_request(f"`top_p` must be in (0, 1], got {top_p}", param="top_p")
    top_k = read_int(fields, "top_k", -1)
    if top_k is not None and top_k < -1:
        raise invalid_request(f"`top_k` must be -1 or 0 (off) or positive, got {top_k}", param="top_k")
    seed = read_int(fields, "seed", None)
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise invalid_request("`seed` must fit in 64 bits", param="seed")

    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k if top_k is not None and top_k > 0 else None,
        seed=seed,
        stop=_stop_strings(fields.get("stop")),
        include_stop_str_in_output=read_bool(fields, "include_stop_str_in_output", False),
        stop_token_ids=read_token_ids(fields.get("stop_token_ids") or [], "stop_token_ids"),
        ignore_eos=read_bool(fields, "ignore_eos", False),
        skip_special_tokens=read_bool(fields, "skip_special_tokens", True),
        logprobs=logprobs,
        return_token_ids=read_bool(fields, "return_token_ids", False),
        stream=stream,
        include_usage=read_bool(stream_options or {}, "include_usage", False),
    )


def read_logprobs_count(fields: dict[str, Any], name: str) -> int | None:
    """An integer number of alternatives in [0, MAX_LOGPROBS], or None when absent or null."""
    value = read_int(fields, name, None)
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise invalid_request(f"`{name}` must be an integer in [0, {MAX_LOGPROBS}], got {value}", param=name)
    return value


def _stop_strings(value: object) -> tuple[str, ...]:
    """`stop`: null, a string, or a list of at most 4 strings; empty strings stop nothing and are dropped."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid_request("`stop` must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid_request(
            f"`stop` takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}; for token ids use "
            "`stop_token_ids`",
            param="stop",
        )
    return tuple(s for s in stops if s)
