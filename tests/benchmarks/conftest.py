"""Fixtures: a word-level tokenizer written to disk, a text of sonnets, a fake OpenAI server (the e2e tests'
tiny checkpoint is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.benchmarks.openai_fake import FakeServer
from tests.benchmarks.texts import SONNETS, WORDS


@pytest.fixture
def word_tokenizer_path(tmp_path: Path) -> Path:
    """A tokenizer.json whose tokens are WORDS (decoding joins them with spaces)."""
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["[UNK]", "<eos>"])
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeServer, str]]:
    """A FakeServer on a free loopback port, and its URL."""
    fake = FakeServer()
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
def sonnets_path(tmp_path: Path) -> Path:
    """SONNETS written to a file, for --dataset-path."""
    path = tmp_path / "sonnets.txt"
    path.write_text(SONNETS, encoding="utf-8")
    return path
