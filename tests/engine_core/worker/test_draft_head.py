"""Rank 0's copy of a target's embedding and LM head for a drafter at N > 1 (worker/draft_head.py): its
lookups and logits equal the one-rank runner's exactly, and loading it reads those tensors only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.models import weights
from openinfer.engine_core.testing.checkpoint_reads import ReadCounter
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.draft_head import DraftHead
from openinfer.engine_core.worker.model_runner import ModelRunner

CPU = torch.device("cpu")


def _qwen3_tied(folder: Path) -> Path:
    return make_tiny_checkpoint(folder, seed=3, overrides=SMALL_TEXT_QWEN3)


def _qwen3_untied(folder: Path) -> Path:
    return make_tiny_checkpoint(folder, seed=4, tie_word_embeddings=False, overrides=SMALL_TEXT_QWEN3)


def _qwen3_5_released(folder: Path) -> Path:
    # the text model under model.language_model., beside a vision tower and an MTP head it never reads
    return make_tiny_qwen3_5_checkpoint(folder, seed=5)


@pytest.mark.parametrize("make", [_qwen3_tied, _qwen3_untied, _qwen3_5_released])
def test_copy_equals_the_one_rank_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Callable[[Path], Path]
) -> None:
    """Embeddings and float32 logits (1 row: the plain matmul; 3 rows: the CPU-packed one) equal a
    TensorParallel.SINGLE runner's bit for bit; the load reads the embedding (and an untied head) only."""
    checkpoint = make(tmp_path / "t")
    runner = ModelRunner(checkpoint, CPU, 8, 4)
    config = runner.model_config
    counter = ReadCounter()
    monkeypatch.setattr(weights, "safe_open", counter.open)
    head = DraftHead.load(checkpoint, config, CPU, runner.dtype)
    monkeypatch.undo()
    matrices = 1 if config.tie_word_embeddings else 2
    assert counter.values == matrices * config.vocab_size * config.hidden_size
    assert head.nbytes == counter.values * 4  # float32
    ids = torch.tensor([[0, 7, config.vocab_size - 1], [5, 5, 11]])
    with torch.inference_mode():
        assert torch.equal(head.embed(ids), runner.embed(ids))
        hidden = torch.randn(3, config.hidden_size, generator=torch.Generator().manual_seed(0))
        for rows in (hidden[:1], hidden):
            logits = head.compute_logits(rows)
            assert logits.dtype == torch.float32 and logits.shape == (len(rows), config.vocab_size)
            assert torch.equal(logits, runner.compute_logits(rows))
