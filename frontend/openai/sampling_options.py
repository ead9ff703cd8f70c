"""The generation parameters /v1/completions and /v1/chat/completions share, and the engine request."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.body.decode import INT64_MAX, Int64
from openinfer.frontend.openai.context_limits import check_max_tokens, check_prompt_chars, output_room
from openinfer.frontend.openai.errors import invalid_request
from openinfer.frontend.openai.logits_options import TYPE_MESSAGES as LOGITS_TYPE_MESSAGES
from openinfer.frontend.openai.logits_options import LogitsBody, LogitsOptions
from openinfer.frontend.openai.structured_constraint import StructuredConstraint
from openinfer.protocol import EngineCoreRequest, SamplingParams

MAX_STOP_STRINGS = 4  # OpenAI's limit on `stop`
MAX_LOGPROBS = 20  # alternatives per token, at most (OpenAI's chat limit, vLLM's default --max-logprobs)
# Choices per request, at most: each is an engine request of its own (vLLM's bound is 16384 by default).
MAX_N = 128
GREEDY_TEMPERATURE = 1e-5  # below it sampling is greedy (the engine's rule, vLLM's _SAMPLING_EPS)

TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
T = TypeVar("T")

_GUIDED = 'vLLM\'s deprecated `guided_{0}` is not supported: send `structured_outputs: {{"{0}": ...}}`'

# OpenAI / vLLM parameters of both endpoints that openinfer does not support, with the values that mean
# "not used" and what to say about any other value: it is refused rather than silently ignored.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((None, 1), "`best_of` is not supported by openinfer: send `n` for several choices"),
    "use_beam_search": ((None, False), "beam search is not supported by openinfer"),
    "echo": ((None, False), "`echo` is not supported by openinfer"),
    "prompt_logprobs": ((None,), "`prompt_logprobs` is not supported by openinfer"),
    "allowed_token_ids": ((None,), "`allowed_token_ids` is not supported by openinfer: use `logit_bias`"),
    **{f"guided_{kind}": ((None,), _GUIDED.format(kind)) for kind in ("json", "regex", "choice", "grammar")},
    # SGLang's, which sglang-router and vllm-router add to every body they forward (at these defaults)
    "no_stop_trim": ((None, False), "`no_stop_trim` is not supported: send `include_stop_str_in_output`"),
    "return_hidden_states": ((None, False), "`return_hidden_states` is not supported by openinfer"),
}

# Messages for fields whose types the generic "`x` must be ..." says badly.
TYPE_MESSAGES = {
    "stop": "`stop` must be a string or a list of strings",
    "stop_token_ids": "`stop_token_ids` must be a list of non-negative integer token ids",
    **LOGITS_TYPE_MESSAGES,
}


class StreamOptions(msgspec.Struct, frozen=True):
    """``stream_options``; null fields mean the default, as absent ones do."""

    include_usage: bool | None = None  # default false: a final chunk with the usage


class SamplingBody(LogitsBody, frozen=True):
    """The body fields both endpoints share (the logits processors' in ``LogitsBody``). A null field means
    its default, as an absent one does; flags default to false unless said."""

    model: str | None = None  # None: the first served model
    stream: bool | None = None
    stream_options: StreamOptions | None = None  # only with stream: true
    temperature: float | None = None  # default 1
    top_p: float | None = None  # default 1
    top_k: Int64 | None = None  # -1, 0 or None: the whole vocabulary
    seed: Int64 | None = None  # vLLM's range
    n: Int64 | None = None  # default 1: choices, in [1, MAX_N]
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None  # default true
    return_token_ids: bool | None = None
    # Checked by parse_structured, which names the bad part (response_format.json_schema.schema, ...)
    response_format: Any = None
    structured_outputs: Any = None
    # Refused unless neutral (UNSUPPORTED); typed Any so that any value reaches its own message.
    best_of: Any = None
    use_beam_search: Any = None
    echo: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    no_stop_trim: Any = None
    return_hidden_states: Any = None


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
    logits: LogitsOptions = LogitsOptions()  # penalties, min_tokens, logit_bias, bad words, min_p
    structured: StructuredConstraint | None = None  # response_format / structured_outputs; None: free
    max_tokens_param: str = "max_tokens"  # the body field max_tokens came from (chat: max_completion_tokens)
    n: int = 1  # choices: engine requests of the same prompt, choice i seeded with seed + i

    @classmethod
    def from_body(
        cls,
        body: SamplingBody,
        max_tokens_field: str,
        max_tokens: int | None,
        logprobs: int | None,
        structured: StructuredConstraint | None,
    ) -> SamplingOptions:
        """The shared fields of a decoded body, with their defaults; 400 naming the first bad one.

        ``max_tokens`` is the output bound the endpoint read from ``max_tokens_field`` ("max_tokens", or
        chat's "max_completion_tokens"); ``logprobs`` is already read, each endpoint spelling it its own way;
        ``structured`` is the request's whole constraint, the server's settings on it (chat's: its forced
        tool call, if any).
        """
        stream = _or(body.stream, False)
        if body.stream_options is not None and not stream:
            raise invalid_request("`stream_options` needs `stream: true`", param="stream_options")
        if max_tokens is not None and max_tokens <= 0:
            raise invalid_request(
                f"`{max_tokens_field}` must be at least 1, got {max_tokens}", param=max_tokens_field
            )
        temperature = _or(body.temperature, 1.0)
        if temperature < 0:
            raise invalid_request(f"`temperature` must be >= 0, got {temperature}", param="temperature")
        top_p = _or(body.top_p, 1.0)
        if not 0 < top_p <= 1:
            raise invalid_request(f"`top_p` must be in (0, 1], got {top_p}", param="top_p")
        top_k = body.top_k
        if top_k is not None and top_k < -1:
            raise invalid_request(f"`top_k` must be -1 or 0 (off) or positive, got {top_k}", param="top_k")
        include_usage = body.stream_options is not None and _or(body.stream_options.include_usage, False)
        n = _choices(_or(body.n, 1), temperature, body.seed)
        return cls(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k if top_k is not None and top_k > 0 else None,
            seed=body.seed,
            stop=_stop_strings(body.stop),
            include_stop_str_in_output=_or(body.include_stop_str_in_output, False),
            stop_token_ids=_or(body.stop_token_ids, []),
            ignore_eos=_or(body.ignore_eos, False),
            skip_special_tokens=_or(body.skip_special_tokens, True),
            logprobs=logprobs,
            return_token_ids=_or(body.return_token_ids, False),
            stream=stream,
            include_usage=include_usage,
            logits=LogitsOptions.from_body(body, max_tokens_field, max_tokens),
            structured=structured,
            max_tokens_param=max_tokens_field,
            n=n,
        )

    def check_before_tokenizing(self, model: ServedModel, prompt_text: str | None, prompt_param: str) -> None:
        """The cheap refusals, before a prompt is tokenized (vLLM's order): an output bound past the model's
        context, then a ``prompt_text`` too long for it whatever its tokens (None: a prompt of token ids)."""
        check_max_tokens(self.max_tokens, self.max_tokens_param, model)
        if prompt_text is not None:
            check_prompt_chars(prompt_text, prompt_param, model)

    def engine_request(
        self,
        model: ServedModel,
        prompt_token_ids: list[int],
        request_id: str,
        prompt_param: str = "prompt",
        structured_start_after: int | None = None,
    ) -> EngineCoreRequest:
        """Bound the request for ``model``: prompt + output never exceed its max_model_len (an output bound
        that would is cut to the room the prompt leaves, as vLLM cuts it; one past the context is a 400).

        EOS is not passed: the engine knows its EOS ids and honours ``ignore_eos``. ``prompt_param`` names
        the field a bad prompt is blamed on ("messages" for chat). Bad words become token ids here.
        ``structured_start_after``: the token after which the constraint applies (chat's ``</think>``
        where the output starts in reasoning); None: from the first output token.
        """
        check_max_tokens(self.max_tokens, self.max_tokens_param, model)
        room = output_room(len(prompt_token_ids), prompt_param, model)  # before the O(prompt) checks
        for name, ids in ((prompt_param, prompt_token_ids), ("stop_token_ids", self.stop_token_ids)):
            if any(token_id >= model.vocab_size for token_id in ids):
                raise invalid_request(
                    f"`{name}` holds a token id >= the vocabulary size {model.vocab_size}", name
                )
        max_tokens = room if self.max_tokens is None else min(self.max_tokens, room)
        logits = self.logits
        bad_words_token_ids = logits.bad_words_token_ids(model.tokenizer, model.vocab_size, max_tokens)
        structured = self.structured
        # One pass: every engine field from its option; stop strings and output shaping stay here.
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop_token_ids=list(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            presence_penalty=logits.presence_penalty,
            frequency_penalty=logits.frequency_penalty,
            repetition_penalty=logits.repetition_penalty,
            min_tokens=logits.min_tokens,
            logit_bias=logits.logit_bias,
            bad_words_token_ids=bad_words_token_ids,
            min_p=logits.min_p,
            structured_outputs=None
            if structured is None
            else structured.engine_outputs(structured_start_after),
        )
        return EngineCoreRequest(request_id, prompt_token_ids, params, arrival_time=time.time())


def check_logprobs_count(value: int | None, name: str) -> int | None:
    """``value`` when it is a number of alternatives in [0, MAX_LOGPROBS] or None (not asked); else 400."""
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise invalid_request(f"`{name}` must be an integer in [0, {MAX_LOGPROBS}], got {value}", param=name)
    return value


def _choices(n: int, temperature: float, seed: int | None) -> int:
    """``n`` when it is a number of choices openinfer serves for these sampling options; else 400."""
    if not 1 <= n <= MAX_N:
        more = "; make several requests for more choices" if n > MAX_N else ""
        raise invalid_request(f"`n` must be in [1, {MAX_N}], got {n}{more}", param="n")
    if n > 1 and temperature < GREEDY_TEMPERATURE:  # vLLM's refusal: n identical choices
        raise invalid_request(f"`n` must be 1 when using greedy sampling (temperature 0), got {n}", param="n")
    if seed is not None and seed + n - 1 > INT64_MAX:
        raise invalid_request(
            f"`seed` must be at most {INT64_MAX - n + 1} with `n` = {n}: choice i samples with seed + i",
            param="seed",
        )
    return n


def _or(value: T | None, default: T) -> T:
    """``value``, or ``default`` where the body has null or nothing."""
    return default if value is None else value


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """`stop`: null, a string, or a list of at most 4 strings; empty strings stop nothing and are dropped."""
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid_request(
            f"`stop` takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}; for token ids use "
            "`stop_token_ids`",
            param="stop",
        )
    return tuple(s for s in stops if s)
