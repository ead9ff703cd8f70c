"""The vocabulary matrix (embedding and LM head) held transposed: loaded exactly, embedding and head agree,
and packed for oneDNN on the CPU they still agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.engine_core.models.vocab_matrix import VocabMatrix
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.kernel_backends import choose_kernel_backends


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_head_is_the_checkpoint_matrix_transposed(tmp_path: Path, tied: bool) -> None:
    """Loaded, the LM head's weight_t is the checkpoint's head (or tied embedding) transposed, bit for bit,
    its logits are hidden @ head.T, and a tied embedding looks up the checkpoint's rows."""
    folder = make_tiny_checkpoint(tmp_path, seed=3, tie_word_embeddings=tied, overrides=SMALL_QWEN3)
    stored = load_file(folder / "model.safetensors")
    config = ModelConfig.from_folder(folder)
    model = Qwen3ForCausalLM(config, choose_kernel_backends(torch.device("cpu")))
    model.load_weights(folder)
    head = model.lm_head if model.lm_head is not None else model.model.embed_tokens
    assert isinstance(head, VocabMatrix)
    expected = stored["model.embed_tokens.weight" if tied else "lm_head.weight"]  # (256, 64)
    assert head.weight_t.is_contiguous() and torch.equal(head.weight_t, expected.t())
    hidden = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model.compute_logits(hidden), hidden @ expected.t())
    token_ids = torch.tensor([0, 255, 17])
    assert torch.equal(model.model.embed_tokens(token_ids), stored["model.embed_tokens.weight"][token_ids])


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_packed_head_on_the_cpu(tmp_path: Path, tied: bool) -> None:
    """The CPU runner packs the head for oneDNN (float32 runs on any oneDNN build): logits are still
    hidden @ head.T from one row (the plain matrix) to many (the packed copy), a tied embedding still looks
    up the checkpoint's rows exactly."""
    folder = make_tiny_checkpoint(tmp_path, seed=3, tie_word_embeddings=tied, overrides=SMALL_QWEN3)
    stored = load_file(folder / "model.safetensors")
    runner = ModelRunner(folder, torch.device("cpu"), num_kv_blocks=1, block_size=16, dtype=torch.float32)
    model = runner.model
    head = model.lm_head if model.lm_head is not None else model.model.embed_tokens
    assert isinstance(head, VocabMatrix) and head.packed is not None
    expected = stored["model.embed_tokens.weight" if tied else "lm_head.weight"]  # (256, 64)
    for rows in (1, 3, 40):  # one decode row, a few, past the 32 rows oneDNN packs for
        hidden = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(runner.compute_logits(hidden), hidden @ expected.t())
    token_ids = torch.tensor([0, 255, 17])
    assert torch.equal(runner.embed(token_ids), stored["model.embed_tokens.weight"][token_ids])
