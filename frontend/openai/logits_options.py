"""The logits-processor parameters both endpoints take (OpenAI's penalties and logit_bias, vLLM's
repetition_penalty, min_tokens, bad_words and min_p), checked with OpenAI's and vLLM's ranges, and the engine
fields they become: token ids only, as the engine never sees strings (bad words are tokenized here, as vLLM
tokenizes them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from openinfer.frontend.openai.body.decode import Int64
from openinfer.frontend.openai.errors import invalid_request
from openinfer.frontend.tokenizer import Tokenizer

MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on a bias, either way
MAX_LOGIT_BIAS_TOKENS = 1024  # vLLM's (its GPU runner's MAX_NUM_LOGIT_BIAS_TOKENS)
MAX_BAD_WORDS = 128  # token sequences after tokenization (vLLM's VLLM_MAX_NUM_BAD_WORDS)
MAX_BAD_WORD_TOKENS = 1024  # tokens in all of them (vLLM's VLLM_MAX_BAD_WORDS_TOTAL_TOKENS)

TYPE_MESSAGES = {
    "logit_bias": "`logit_bias` must be an object mapping token ids (as strings) to numbers in [-100, 100]",
    "bad_words": "`bad_words` must be a list of strings",
}


class LogitsBody(msgspec.Struct, frozen=True):
    """Body fields of both endpoints; null means the default, as absent does."""

    presence_penalty: float | None = None  # default 0, in [-2, 2]
    frequency_penalty: float | None = None  # default 0, in [-2, 2]
    repetition_penalty: float | None = None  # default 1 (off), > 0
    min_tokens: Int64 | None = None  # default 0, at most max_tokens
    logit_bias: dict[str, float] | None = None  # token id (a string, as JSON keys are) -> bias
    bad_words: list[str] | None = None
    min_p: float | None = None  # default 0 (off), in [0, 1]


@dataclass(frozen=True)
class LogitsOptions:
    """How one request's logits are processed before sampling (the engine's ``SamplingParams`` fields of the
    same names, vLLM's semantics; bad words still as text)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    bad_words: tuple[str, ...] = ()  # distinct, in the order given
    min_p: float = 0.0

    @classmethod
    def from_body(cls, body: LogitsBody, max_tokens_field: str, max_tokens: int | None) -> LogitsOptions:
        """The options of a decoded body; 400 naming the first bad one. ``max_tokens`` is the request's
        output bound, read from ``max_tokens_field`` (None: unbounded, checked against the room later)."""
        for name, value in (
            ("presence_penalty", body.presence_penalty),
            ("frequency_penalty", body.frequency_penalty),
        ):
            if value is not None and not -2.0 <= value <= 2.0:
                raise invalid_request(f"`{name}` must be in [-2, 2], got {value}", param=name)
        repetition = 1.0 if body.repetition_penalty is None else body.repetition_penalty
        if not (math.isfinite(repetition) and repetition > 0):
            raise invalid_request(
                f"`repetition_penalty` must be greater than 0, got {repetition}", param="repetition_penalty"
            )
        min_p = 0.0 if body.min_p is None else body.min_p
        if not 0.0 <= min_p <= 1.0:
            raise invalid_request(f"`min_p` must be in [0, 1], got {min_p}", param="min_p")
        min_tokens = body.min_tokens or 0
        if min_tokens < 0:
            raise invalid_request(f"`min_tokens` must be at least 0, got {min_tokens}", param="min_tokens")
        if max_tokens is not None and min_tokens > max_tokens:
            raise invalid_request(
                f"`min_tokens` must be at most `{max_tokens_field}` ({max_tokens}), got {min_tokens}",
                param="min_tokens",
            )
        bad_words = tuple(dict.fromkeys(body.bad_words or []))
        if "" in bad_words:
            raise invalid_request("`bad_words` cannot contain an empty string", param="bad_words")
        return cls(
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0,
            repetition_penalty=repetition,
            min_tokens=min_tokens,
            logit_bias=_logit_bias(body.logit_bias or {}),
            bad_words=bad_words,
            min_p=min_p,
        )

    def bad_words_token_ids(self, tokenizer: Tokenizer, vocab_size: int, max_tokens: int) -> list[list[int]]:
        """The bad words as token ids for a model with this tokenizer and vocabulary, once these options are
        checked for it and a request bounded to ``max_tokens``: 400 for logit_bias ids outside the
        vocabulary, or a ``min_tokens`` above the output room the prompt leaves (when the request set no
        bound itself)."""
        outside = sorted(t for t in self.logit_bias if not 0 <= t < vocab_size)
        if outside:
            raise invalid_request(
                f"`logit_bias` holds token ids outside the vocabulary of {vocab_size} tokens: {outside}",
                param="logit_bias",
            )
        if self.min_tokens > max_tokens:
            raise invalid_request(
                f"`min_tokens` ({self.min_tokens}) is more than the {max_tokens} tokens of output this prompt "
                "leaves room for",
                param="min_tokens",
            )
        return bad_words_token_ids(self.bad_words, tokenizer, vocab_size)


def bad_words_token_ids(words: tuple[str, ...], tokenizer: Tokenizer, vocab_size: int) -> list[list[int]]:
    """Each word's tokens without special tokens (leading spaces stripped), then those of " " + the word
    where that is a distinct token sequence of the same length: vLLM's rule, so that a word is barred at the
    start of the text and after a space alike. 400 when a word has no tokens or there are too many."""
    sequences: list[list[int]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not plain:
            raise invalid_request(f"`bad_words` entry {word!r} has no tokens", param="bad_words")
        sequences.append(plain)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    if len(sequences) > MAX_BAD_WORDS:
        raise invalid_request(
            f"`bad_words` makes {len(sequences)} token sequences; at most {MAX_BAD_WORDS}", param="bad_words"
        )
    if sum(len(s) for s in sequences) > MAX_BAD_WORD_TOKENS:
        raise invalid_request(f"`bad_words` holds more than {MAX_BAD_WORD_TOKENS} tokens", param="bad_words")
    if any(t >= vocab_size for s in sequences for t in s):
        raise invalid_request(
            f"`bad_words` tokenize to ids outside the model's vocabulary of {vocab_size}", param="bad_words"
        )
    return sequences


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's logit_bias with integer keys (as vLLM reads them: ``int(key)``; a later duplicate wins)."""
    if len(bias) > MAX_LOGIT_BIAS_TOKENS:
        raise invalid_request(
            f"`logit_bias` takes at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {len(bias)}", param="logit_bias"
        )
    out = {}
    for key, value in bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise invalid_request(
                f"`logit_bias` keys must be token ids (integers, as strings), got {key!r}", param="logit_bias"
            ) from None
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise invalid_request(
                f"`logit_bias` values must be in [-100, 100], got {value} for token {key}", param="logit_bias"
            )
        out[token_id] = value
    return out
