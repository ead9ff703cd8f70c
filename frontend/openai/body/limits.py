"""Request bodies read within a size bound and a deadline, and bounded before they are decoded by what the served
models can take.

Decoding JSON holds the GIL for as long as it runs (msgspec, as every decoder: measured, a 160 ms decode in
a thread stalls the event loop for 160 ms), so a body's decode is kept short by bounding it first, not by
moving the decode to a thread. Strings decode at about 1 ms per MiB; numbers 10 times slower, objects up to
70 times. So three bounds are checked before anything is decoded:

- the whole body: at most the JSON the largest valid request for a served model needs (a text prompt of
  :func:`max_prompt_chars` characters or its token ids, as many logit_bias entries and stop token ids as the
  model takes, the most bad words, and :data:`ALLOWANCE_BYTES` for the rest). A larger body is a 413, by its
  Content-Length before it is read, or, sent chunked, as soon as it passes the bound
  (:func:`read_body`, which also gives it a deadline: 408);
- within it, the fields made of numbers (token ids as a prompt, ``logit_bias``, ``stop_token_ids``): a field
  longer than its largest valid value is a 400 naming it;
- the number of values: at most :data:`VALUES_PER_TOKEN` per token of the context plus
  :data:`VALUES_ALLOWANCE` (a message, a tool's property, a token id each take at least a token of the prompt;
  logit_bias entries and the other fields fit the allowance), or a 400 saying how many the body holds.

The last two come from the body's census (:mod:`~openinfer.frontend.openai.body.census`), taken on the loop
for a small body and in a worker process for a large one, so that the loop's share of even the largest body
is reading it and the decode of what passed.

A bound counts the JSON the most verbose valid value takes: ids of the vocabulary's most digits, numbers of
:data:`_NUMBER_CHARS` characters, text escaped byte by byte (``\\u0001``: 6 bytes of JSON for a byte of
UTF-8; a text that fits has at most :func:`max_prompt_chars` bytes, as the character rule assumes a
byte-level vocabulary) and :data:`_WHITESPACE_PER_VALUE` bytes of indentation around each value.

The body itself is read a chunk at a time (:func:`read_body`): aiohttp's own ``request.read()`` buffers a body
up to the app's ``client_max_size`` before anyone can look at it, and waits for it as long as the client
likes, so a client that trickles its body, or never ends a chunked one, would hold its connection (and up to
64 MiB) for ever. Here a body is refused as soon as it passes its bound (413, by its Content-Length before a
byte is read when it has one), and a body not all in within the deadline is a 408. Neither uvicorn nor so
vLLM bounds the time a body takes (uvicorn's proposed ``--timeout-request-complete``, 60 s, was never built);
408 is HTTP's status for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.body.census import BodyCensus
from openinfer.frontend.openai.body.census_worker import CensusWorker
from openinfer.frontend.openai.context_limits import max_prompt_chars
from openinfer.frontend.openai.errors import ApiError, invalid_request
from openinfer.frontend.openai.logits_options import MAX_BAD_WORD_TOKENS, MAX_LOGIT_BIAS_TOKENS

# Room for what no model's numbers bound: a JSON schema or grammar, tool definitions a chat template does not
# render, stop strings, the other fields and their names.
ALLOWANCE_BYTES = 256 * 1024
_JSON_BYTES_PER_TEXT_BYTE = 6  # a control character escaped as \u0001 (a 4-byte character as a pair: 12)
_NUMBER_CHARS = 24  # the longest repr of a double: -2.2250738585072014e-308
_WHITESPACE_PER_VALUE = 16  # a newline and indentation, as pretty-printers write each value of a list
# Values in a body (commas between items of its lists and objects) per token of the context, plus an
# allowance: 4 x 40960 + 65,536 = 229,376 for Qwen3's context, decoded in about 60 ms at the worst.
VALUES_PER_TOKEN = 4
VALUES_ALLOWANCE = 65_536
_CHUNK_BYTES = 1 << 20  # aiohttp buffers up to twice this before it stops reading the socket


@dataclass(frozen=True)
class BodyLimits:
    """The most bytes of JSON a valid request body, and each of its number fields, can need; the largest
    over the served models (each request is then checked against its own model after decoding)."""

    body: int
    prompt_token_ids: int  # the prompt as token ids (a one-element list of them too)
    logit_bias: int
    stop_token_ids: int
    max_model_len: int  # of the model with the longest context, for the messages
    vocab_size: int  # of the model with the largest vocabulary

    @property
    def values(self) -> int:
        """The most JSON values (commas between items of lists and objects) a body may hold."""
        return VALUES_PER_TOKEN * self.max_model_len + VALUES_ALLOWANCE

    @classmethod
    def for_model(cls, model: ServedModel) -> BodyLimits:
        """The bounds of a body for ``model``."""
        id_bytes = len(str(model.vocab_size - 1)) + 1 + _WHITESPACE_PER_VALUE  # digits, a comma
        bias_entry = id_bytes + 2 + 1 + _NUMBER_CHARS  # "id": number,
        text = max_prompt_chars(model) * _JSON_BYTES_PER_TEXT_BYTE + 2
        prompt_token_ids = model.max_model_len * id_bytes + 4 * _WHITESPACE_PER_VALUE  # [[ ... ]]
        logit_bias = min(model.vocab_size, MAX_LOGIT_BIAS_TOKENS) * bias_entry + 2 * _WHITESPACE_PER_VALUE
        stop_token_ids = model.vocab_size * id_bytes + 2 * _WHITESPACE_PER_VALUE
        # bad words: at most 1024 tokens in all (MAX_BAD_WORD_TOKENS), each of the longest spelling
        bad_words = MAX_BAD_WORD_TOKENS * (
            model.tokenizer.max_chars_per_token * _JSON_BYTES_PER_TEXT_BYTE + 3 + _WHITESPACE_PER_VALUE
        )
        body = max(text, prompt_token_ids) + logit_bias + stop_token_ids + bad_words + ALLOWANCE_BYTES
        return cls(body, prompt_token_ids, logit_bias, stop_token_ids, model.max_model_len, model.vocab_size)

    @classmethod
    def for_models(cls, models: Sequence[ServedModel]) -> BodyLimits:
        """The bounds of a body for any of ``models`` (at least one)."""
        each = [cls.for_model(model) for model in models]
        return cls(
            body=max(limits.body for limits in each),
            prompt_token_ids=max(limits.prompt_token_ids for limits in each),
            logit_bias=max(limits.logit_bias for limits in each),
            stop_token_ids=max(limits.stop_token_ids for limits in each),
            max_model_len=max(limits.max_model_len for limits in each),
            vocab_size=max(limits.vocab_size for limits in each),
        )

    async def read(self, request: web.BaseRequest, census: CensusWorker, timeout: float) -> bytes:
        """The request's body, checked: 413 before reading it when its Content-Length is past the bound (or,
        without one, once the bound is passed), 408 when it is not all in within ``timeout`` seconds; then,
        from its ``census``, 400 when it is not JSON, naming a number field longer than any valid value of
        it, or when it holds more values than :attr:`values`."""
        body = await read_body(request, self.body, timeout, self._too_large)
        self.check(await census.take(body))
        return body

    def check(self, census: BodyCensus) -> None:
        """400 for what a body's census shows to be past every valid request's."""
        if census.not_json is not None:  # the body's decoder would say so too, after decoding what precedes
            raise invalid_request(f"the request body is not valid JSON: {census.not_json}")
        if census.prompt_bytes > self.prompt_token_ids:
            raise invalid_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt "
                f"of token ids is {census.prompt_bytes} bytes of JSON, more than {self.prompt_token_ids} bytes, "
                f"which is the upper bound for {self.max_model_len} token ids. Please reduce the length of the "
                "input prompt.",
                param="prompt",
            )
        entries = min(self.vocab_size, MAX_LOGIT_BIAS_TOKENS)
        for name, size, bound, words in (
            ("logit_bias", census.logit_bias_bytes, self.logit_bias, f"{entries} entries"),
            (
                "stop_token_ids",
                census.stop_token_ids_bytes,
                self.stop_token_ids,
                f"{self.vocab_size} token ids",
            ),
        ):
            if size > bound:
                raise invalid_request(
                    f"`{name}` is {size} bytes of JSON, more than {bound} bytes, which is the upper bound "
                    f"for {words} (the model's vocabulary has {self.vocab_size} tokens)",
                    param=name,
                )
        if census.commas > self.values:
            raise invalid_request(
                f"the request body separates {census.commas} JSON values (commas between the items of its "
                f"lists and objects), more than the {self.values} a request for the served models can need "
                f"({VALUES_PER_TOKEN} per token of their {self.max_model_len}-token context, plus "
                f"{VALUES_ALLOWANCE}). Please send fewer messages, tools or parameters."
            )

    def _too_large(self, length: int | None) -> ApiError:
        size = f"{length} bytes, more than" if length is not None else "more than"
        return ApiError(
            413,
            f"the request body is {size} the {self.body} bytes the largest valid request for the served "
            f"models takes (a prompt of {self.max_model_len} tokens of the longest spelling, plus every "
            "parameter at its largest). Please reduce the length of the input prompt.",
            code="request_too_large",
        )


async def read_body(
    request: web.BaseRequest,
    max_bytes: int,
    timeout: float,
    too_large: Callable[[int | None], ApiError],
) -> bytes:
    """The request's body, of at most ``max_bytes``, in within ``timeout`` seconds of the call.

    ``too_large(length)`` is the error for a larger body: ``length`` is its Content-Length, refused before
    anything is read, or None for a body without one, refused once ``max_bytes`` are passed (the rest is never
    read: the connection closes after the answer). Past the deadline, 408 (``request_timeout``).
    """
    length = request.content_length
    if length is not None and length > max_bytes:
        raise too_large(length)
    content = request.content
    content.set_read_chunk_size(min(max_bytes, _CHUNK_BYTES))
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            while chunk := await content.readany():
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(None)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body was not all received within {timeout:g} s of its headers ({size} bytes "
            "came); send it at once, or raise the server's --http-timeout-body",
            code="request_timeout",
        ) from None
    return b"".join(chunks)
