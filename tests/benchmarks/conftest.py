"""Fixtures: a word-level tokenizer written to disk, and the e2e tests' tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from tests.e2e.conftest import SMALL

# Word-level, so that token counts in the tests are word counts; ids 0 and 1 are special.
WORDS = ["[UNK]", "<eos>", "to", "be", "or", "not", "that", "is", "the", "question"]


@pytest.fixture
def word_tokenizer_path(tmp_path: Path) -> Path:
    """A tokenizer.json whose tokens are WORDS (decoding joins them with spaces)."""
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["[UNK]", "<eos>"])
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The e2e tests' small checkpoint (built-in tokenizer's vocabulary, so text prompts work)."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("model") / "tiny", seed=3, overrides=SMALL)
