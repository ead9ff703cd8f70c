"""The bench's tokenizer: prompt lengths in tokens, and the text tokens random prompts are drawn from."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from tokenizers import Tokenizer

ALLOWED_WHITESPACE = frozenset(" \n\t")


def load_tokenizer(path: Path | None = None) -> Tokenizer:
    """A ``tokenizer.json`` file or a model folder holding one; None: the built-in model's tokenizer.

    Prompt lengths and random prompts are only exact for the server's own tokenizer: pass its model's.
    """
    if path is None:
        builtin = importlib.resources.files("openinfer.engine_core") / "builtin" / "tokenizer.json"
        return Tokenizer.from_str(builtin.read_text(encoding="utf-8"))
    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises its own Exception subclass on a bad or missing file
        raise ValueError(
            f"cannot load a tokenizer from {file} ({e}): give a tokenizer.json or its folder"
        ) from e


def text_token_ids(tokenizer: Tokenizer) -> list[int]:
    """Every token id that is text on its own: not a special token, and decoding to printable characters.

    Byte-level tokens of half a UTF-8 character (they decode to U+FFFD) and control bytes are left out, so a
    prompt of these tokens is text that a server re-encodes to about as many tokens.
    """
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    ids = []
    for i in range(tokenizer.get_vocab_size()):
        if i in special:
            continue
        text = tokenizer.decode([i], skip_special_tokens=False)
        if text and "\ufffd" not in text and all(c.isprintable() or c in ALLOWED_WHITESPACE for c in text):
            ids.append(i)
    if not ids:
        raise ValueError("the tokenizer has no text tokens to draw random prompts from")
    return ids
