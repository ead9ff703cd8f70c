"""Rank 0's copy of a target's embedding and LM head for a drafter at N > 1 (worker/parallel/draft_head.py): its
lookups and logits equal the one-rank runner's exactly, loading it reads those tensors only, and rank 0's CUDA
share counts its bytes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.config import DrafterSpec, EngineConfig, SpecMethod
from openinfer.engine_core.core.kv_sizing import GpuMemory, checkpoint_bytes, num_kv_blocks
from openinfer.engine_core.models import weights
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.testing.checkpoint_reads import ReadCounter
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.parallel.draft_head import DraftHead, draft_head_bytes

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
    assert head.nbytes == counter.values * 4 == draft_head_bytes(config, torch.float32)  # float32
    ids = torch.tensor([[0, 7, config.vocab_size - 1], [5, 5, 11]])
    with torch.inference_mode():
        assert torch.equal(head.embed(ids), runner.embed(ids))
        hidden = torch.randn(3, config.hidden_size, generator=torch.Generator().manual_seed(0))
        for rows in (hidden[:1], hidden):
            logits = head.compute_logits(rows)
            assert logits.dtype == torch.float32 and logits.shape == (len(rows), config.vocab_size)
            assert torch.equal(logits, runner.compute_logits(rows))


def test_the_gpu_share_of_rank_0_holds_the_copy(tmp_path: Path) -> None:
    """On CUDA at N = 2 with a DFlash drafter, rank 0's --gpu-memory-utilization share holds the copy too: its
    KV cache is the copy's bytes smaller than it would be without it (one byte a block, to count bytes)."""
    target = make_tiny_checkpoint(tmp_path / "t", seed=3, overrides=SMALL_TEXT_QWEN3)
    drafter = make_tiny_dflash_checkpoint(tmp_path / "d", target)
    model = ModelConfig.from_folder(target)
    spec = DrafterSpec(SpecMethod.DFLASH, 3, drafter)
    one, two = (
        EngineConfig(
            model_path=target,
            served_model_name="t",
            kv_cache_gb=None,
            tensor_parallel_size=n,
            speculative=spec,
        )  # fmt: skip
        for n in (1, 2)
    )
    gpu = GpuMemory(free=140 * 2**30, total=141 * 2**30)
    blocks = [num_kv_blocks(config, model, torch.float32, 1, gpu) for config in (one, two)]
    weights = checkpoint_bytes(target, torch.float32)
    assert blocks[1] - blocks[0] == weights - weights // 2 - draft_head_bytes(model, torch.float32)
