from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from tests.e2e.processes import Cluster

# A small checkpoint with the built-in tokenizer's vocabulary, so text prompts work end to end.
SMALL = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("model") / "tiny", seed=3, overrides=SMALL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Cluster]:
    """A frontend and one CPU engine serving the tiny model as "tiny"."""
    c = Cluster(tmp_path_factory.mktemp("logs"))
    try:
        c.start_frontend()
        c.start_engine(tiny_model)
        c.wait_healthy()
        yield c
    finally:
        c.stop()
