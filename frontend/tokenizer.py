"""Text <-> token ids for the frontend, built from the tokenizer files an engine's hello carries."""

from __future__ import annotations

import json
from collections.abc import Sequence

import tokenizers

# Prompt tokens decoded before the first output token, so that decoders which drop a leading space at the
# start of a text (Metaspace, SentencePiece) still give the first output token its space (vLLM uses 5 too).
_PROMPT_CONTEXT_TOKENS = 5

_REPLACEMENT_CHAR = "\ufffd"


class Tokenizer:
    """One model's tokenizer: ``tokenizer.json`` plus what ``tokenizer_config.json`` adds.

    ``tokenizer_config_json`` supplies ``add_bos_token``, the named special tokens and the chat template (kept
    for the chat endpoint). Raises ``ValueError`` when either file is unusable.
    """

    def __init__(self, tokenizer_json: bytes, tokenizer_config_json: bytes = b"{}") -> None:
        try:
            self._tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exception subclasses
            raise ValueError(f"tokenizer.json does not load: {e}") from None
        try:
            config = json.loads(tokenizer_config_json or b"{}")
        except ValueError as e:
            raise ValueError(f"tokenizer_config.json is not JSON: {e}") from None
        if not isinstance(config, dict):
            raise ValueError("tokenizer_config.json must hold a JSON object")

        self.bos_token_id = self._named_token_id(config.get("bos_token"))
        self.eos_token_id = self._named_token_id(config.get("eos_token"))
        self.special_tokens = _special_tokens_map(config)
        self.add_bos_token = bool(config.get("add_bos_token", False))
        self.chat_template = _chat_template(config.get("chat_template"))
        added = self._tokenizer.get_added_tokens_decoder()
        self.special_token_ids = frozenset(token_id for token_id, token in added.items() if token.special)
        self._added_token_ids = frozenset(added)  # their text is literal, not byte-level encoded
        self._token_texts: dict[int, str] = {}  # token_text's cache: at most one entry per vocabulary id
        self._byte_level = _is_byte_level(tokenizer_json)
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        # Ids below this may have a token, no other does (the highest id + 1: added tokens may leave gaps).
        self._num_ids = max(vocab.values(), default=-1) + 1
        # The longest token, in characters of its vocabulary spelling (vLLM's max_chars_per_token): a prompt
        # of more than max_model_len times this many characters cannot fit, whatever its tokens. Sound for
        # byte-level vocabularies, whose spelling has one character per byte (a text character is 1-4).
        self.max_chars_per_token = max(map(len, vocab), default=1)

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary including added tokens."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a prompt, with the special tokens the model expects (BOS where configured).

        ``add_special_tokens=False`` for a rendered chat template, which writes its special tokens itself
        (transformers' ``apply_chat_template`` and vLLM do the same).
        """
        # encode_batch_fast releases the GIL while it works (encode holds it throughout), so a long prompt
        # tokenized in a thread leaves the event loop running; it keeps no character offsets, which makes it
        # faster and its result quick to free (under the GIL). Its ids are encode's.
        ids = self._tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        if not add_special_tokens:
            return ids
        if self.add_bos_token and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def token_text(self, token_id: int) -> str:
        """One token's text on its own, special tokens included (how logprobs name tokens, as vLLM does);
        a token that holds part of a character's bytes reads as U+FFFD, an id the tokenizer lacks as ""."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.decode([token_id], skip_special_tokens=False)
        return text

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``; bytes that do not form a whole character decode to U+FFFD.

        An id the tokenizer lacks decodes as "" (vLLM's rule): a model may have more embedding rows than
        its tokenizer has tokens (Qwen3: 151,936 and 151,669), and a sampled padding row is no error.
        """
        size = self._num_ids
        ids = [t for t in token_ids if 0 <= t < size]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """One token's own bytes (OpenAI's logprobs ``bytes``): exact for byte-level BPE vocabularies, where
        a token may hold part of a character; the UTF-8 of :meth:`token_text` otherwise."""
        piece = self._tokenizer.id_to_token(token_id) if 0 <= token_id < self._num_ids else None
        if self._byte_level and piece is not None and token_id not in self._added_token_ids:
            try:
                return bytes(_BYTE_OF_CHAR[char] for char in piece)
            except KeyError:  # not a byte-level piece after all
                pass
        return self.token_text(token_id).encode("utf-8")

    def token_piece(self, token_id: int) -> str:
        """One token as its vocabulary spells it ("Ġhello" for byte-level " hello", "<|im_end|>"), as
        transformers' ``convert_ids_to_tokens`` (vLLM's /tokenize ``token_strs``); "" for an id it lacks."""
        piece = self._tokenizer.id_to_token(token_id) if 0 <= token_id < self._num_ids else None
        return piece or ""

    def token_id(self, text: str) -> int | None:
        """The id of the added token (``<think>``, ``<|im_start|>``) or vocabulary piece spelled ``text``
        (a byte-level piece as the vocabulary spells it: "Ċ" for a newline); None if there is none."""
        return self._tokenizer.token_to_id(text)

    def _named_token_id(self, token: object) -> int | None:
        content = _token_content(token)
        return None if content is None else self.token_id(content)


def _gpt2_byte_of_char() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's bytes_to_unicode), inverted: each of 256 characters -> its byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    chars.update((b, chr(256 + n)) for n, b in enumerate(shifted))
    return {char: b for b, char in chars.items()}


_BYTE_OF_CHAR = _gpt2_byte_of_char()


def _is_byte_level(tokenizer_json: bytes) -> bool:
    """Whether the tokenizer decodes with ByteLevel (directly or inside a Sequence of decoders)."""
    try:
        decoder = json.loads(tokenizer_json).get("decoder") or {}
    except (ValueError, AttributeError):
        return False
    decoders = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    return any(isinstance(d, dict) and d.get("type") == "ByteLevel" for d in decoders)


# The named special tokens a chat template may use, as transformers passes them to it.
_SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _special_tokens_map(config: dict[str, object]) -> dict[str, object]:
    """``bos_token``, ``eos_token``, ... as strings (and ``additional_special_tokens``), where configured."""
    tokens: dict[str, object] = {}
    for name in _SPECIAL_TOKEN_NAMES:
        token = _token_content(config.get(name))
        if token is not None:
            tokens[name] = token
    additional = config.get("additional_special_tokens")
    if isinstance(additional, list):
        tokens["additional_special_tokens"] = [t for t in map(_token_content, additional) if t is not None]
    return tokens


def _token_content(token: object) -> str | None:
    # tokenizer_config.json writes a named token as "<s>" or as {"content": "<s>", ...}.
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _chat_template(value: object) -> str | None:
    """The default chat template: a string, or the entry named "default" in a list of named templates."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict) and entry.get("name") == "default":
                template = entry.get("template")
                return template if isinstance(template, str) else None
    return None


class IncrementalDetokenizer:
    """Turns one request's output tokens into text deltas as they arrive.

    vLLM's prefix/read offsets: ``ids[prefix_offset:read_offset]`` is text already emitted, kept only as
    context; each step decodes ``ids[prefix_offset:]`` and emits what it adds past that context, unless the
    new text ends in U+FFFD (a character whose bytes span tokens still to come): then it waits. ``finish``
    flushes what is left, so the concatenation of all deltas is the decode of all output tokens.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Only the prompt's tail matters: it is context, never emitted.
        self._ids = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def add(self, new_token_ids: Sequence[int]) -> str:
        """Append output tokens; return the text they complete (possibly "")."""
        self._ids.extend(new_token_ids)
        return self._step(final=False)

    def finish(self) -> str:
        """Return whatever text is still held back (an incomplete character becomes U+FFFD)."""
        return self._step(final=True)

    def _step(self, final: bool) -> str:
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if len(new_text) <= len(prefix_text) or (new_text.endswith(_REPLACEMENT_CHAR) and not final):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], self._skip_special_tokens)
