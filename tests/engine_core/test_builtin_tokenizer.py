"""The committed built-in tokenizer (engine_core/builtin, made by tools/train_tokenizer.py)."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest
from tokenizers import Tokenizer

BUILTIN_DIR = Path(str(files("openinfer.engine_core") / "builtin"))
SPECIAL_IDS = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
SHAKESPEARE = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "ROMEO:\nBut, soft! what light through yonder window breaks?\n",
    "  To be, or not to be: that is the question.\n\n",
]
NON_ASCII = [
    "café é",
    "你好，世界",
    "🤗🚀 emoji",
    "e\u0301 (combining accent kept as is)",
    "\x00\x7f tab\tend",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(BUILTIN_DIR / "tokenizer.json"))


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((BUILTIN_DIR / "tokenizer_config.json").read_text())


def test_vocab_has_exactly_512_tokens(tokenizer: Tokenizer) -> None:
    """The built-in model's embedding has 512 rows: one per token, specials included."""
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 512
    assert len(tokenizer.get_vocab(with_added_tokens=True)) == 512
    assert sorted(tokenizer.get_vocab(with_added_tokens=True).values()) == list(range(512))


def test_special_token_ids(tokenizer: Tokenizer, config: dict) -> None:
    """<|endoftext|> = 0 (EOS and pad), <|im_start|> = 1, <|im_end|> = 2, each one special token."""
    for token, token_id in SPECIAL_IDS.items():
        assert tokenizer.token_to_id(token) == token_id
        assert tokenizer.encode(f"a{token}b").ids[1] == token_id  # never split into bytes
        assert config["added_tokens_decoder"][str(token_id)] == {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    assert tokenizer.decode([1, 0, 2], skip_special_tokens=True) == ""


def test_config_fields(config: dict) -> None:
    """The Hugging Face config names the EOS/pad token and adds no BOS."""
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["eos_token"] == config["pad_token"] == "<|endoftext|>"
    assert config["bos_token"] is None
    assert config["add_bos_token"] is False
    assert config["model_max_length"] == 2048


def test_shakespeare_round_trip(tokenizer: Tokenizer) -> None:
    """Dataset-like text decodes back exactly, in fewer tokens than bytes (merges were learned)."""
    for text in SHAKESPEARE:
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids) == text
        assert len(ids) < len(text.encode())
    # 14 bytes; the trained merges bring "First Citizen:" to 9 tokens.
    assert len(tokenizer.encode("First Citizen:").ids) == 9


@pytest.mark.parametrize("text", NON_ASCII)
def test_non_ascii_round_trip(tokenizer: Tokenizer, text: str) -> None:
    """Byte-level BPE: text unseen in training still encodes (at worst a token per byte) and decodes back."""
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text
    assert 0 < len(ids) <= len(text.encode())
    assert not set(ids) & set(SPECIAL_IDS.values())


def test_every_byte_has_a_token(tokenizer: Tokenizer) -> None:
    """All 256 byte symbols are in the vocabulary, so no input can be unknown."""
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = tokenizer.get_vocab()
    assert all(symbol in vocab for symbol in ByteLevel.alphabet())
    assert len(ByteLevel.alphabet()) == 256


def test_chat_template_renders_chatml(config: dict) -> None:
    """The template gives Qwen's ChatML layout, with the assistant header only when asked for."""
    jinja2 = pytest.importorskip("jinja2")
    # The environment transformers renders chat templates in.
    template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(config["chat_template"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}]
    chatml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n"
    header = "<|im_start|>assistant\n"
    assert template.render(messages=messages, add_generation_prompt=False) == chatml
    assert template.render(messages=messages, add_generation_prompt=True) == chatml + header


def test_transformers_loads_the_folder(tokenizer: Tokenizer) -> None:
    """AutoTokenizer reads the folder and encodes/decodes exactly as the raw tokenizers file does."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(BUILTIN_DIR))
    assert len(hf) == 512
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (0, 0, None)
    assert hf.convert_tokens_to_ids(list(SPECIAL_IDS)) == [0, 1, 2]
    for text in SHAKESPEARE + NON_ASCII:
        ids = hf.encode(text)
        assert ids == tokenizer.encode(text).ids  # no BOS/EOS added
        assert hf.decode(ids) == text
