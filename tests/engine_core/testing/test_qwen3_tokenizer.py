"""The Qwen3 vocabulary built offline (openinfer.engine_core.testing) is Qwen's own: tiktoken's ids on the
same BPE ranks, Qwen3's added tokens at their ids, and transformers loads it as Qwen3's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import AutoTokenizer

from openinfer.engine_core.testing.qwen3_tokenizer import (
    QWEN3_ADDED_TOKENS,
    QWEN3_TOKEN_IDS,
    QWEN3_TOKENIZER_SIZE,
    QWEN_SPLIT_REGEX,
    qwen_tiktoken_file,
    write_qwen3_tokenizer,
)
from openinfer.frontend.tokenizer import Tokenizer

TEXTS = [
    "Hello, world!",
    "ROMEO: But soft, what light through yonder window breaks?",
    "naïve café crème brûlée, 日本語のテキスト, 中文分词, emoji 🙂🚀 and ÅÄÖ",
    "def f(x):\n    return x**2  # 1234567890\n\n\n",
    "  two leading spaces, trailing ones   ",
    "I'll've they're we'd it's 3.14159 $1,000,000",
    "\t\r\n mixed\u00a0whitespace \r\n\r\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen3_tokenizer(tmp_path_factory.mktemp("qwen3-tokenizer"))


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> Tokenizer:
    return Tokenizer(
        (folder / "tokenizer.json").read_bytes(), (folder / "tokenizer_config.json").read_bytes()
    )


@pytest.fixture(scope="module")
def qwen_tiktoken() -> tiktoken.Encoding:
    """Qwen's tiktoken encoding (as its original tokenizer builds it): the ranks, the split, 3 specials."""
    specials = {t: QWEN3_TOKEN_IDS[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    ranks = load_tiktoken_bpe(str(qwen_tiktoken_file()))
    return tiktoken.Encoding("qwen", pat_str=QWEN_SPLIT_REGEX, mergeable_ranks=ranks, special_tokens=specials)


@pytest.mark.parametrize("text", TEXTS)
def test_same_ids_as_tiktoken(tokenizer: Tokenizer, qwen_tiktoken: tiktoken.Encoding, text: str) -> None:
    """Every text (NFC already) encodes to tiktoken's ids and decodes back to itself."""
    ids = tokenizer.encode(text)
    assert ids == qwen_tiktoken.encode(text, allowed_special="all")
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_added_tokens_are_qwen3s(tokenizer: Tokenizer) -> None:
    """The 26 added tokens sit at 151643..151668 (151669 ids); the <|...|> ones are special, the tags are
    not (so <think> stays in decoded text); tokenizer_config.json names <|im_end|> the EOS, adds no BOS."""
    assert tokenizer.vocab_size == QWEN3_TOKENIZER_SIZE == 151669
    assert [tokenizer.encode(t) for t in QWEN3_ADDED_TOKENS] == [[i] for i in range(151643, 151669)]
    assert tokenizer.special_token_ids == set(range(151643, 151657)) | set(range(151659, 151665))
    assert tokenizer.eos_token_id == 151645 and tokenizer.bos_token_id is None
    ids = tokenizer.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\nHi<|im_end|>")
    assert tokenizer.decode(ids) == "assistant\n<think>\nhm\n</think>\n\nHi"


def test_transformers_loads_it_as_qwen3s_tokenizer(folder: Path, tokenizer: Tokenizer) -> None:
    """AutoTokenizer takes the folder as Qwen2Tokenizer (Qwen3's class), with the same ids and specials."""
    hf = AutoTokenizer.from_pretrained(folder)
    assert type(hf).__name__ == "Qwen2Tokenizer" and len(hf) == 151669
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (151645, 151643, None)
    for text in TEXTS:
        assert hf.encode(text) == tokenizer.encode(text)
