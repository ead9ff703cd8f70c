"""Tiny random checkpoints (test fixtures): deterministic and in Hugging Face's format."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint

SMALL = SMALL_QWEN3


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    """Two checkpoints from the same seed have identical safetensors bytes; another seed differs."""
    a = make_tiny_checkpoint(tmp_path / "a", seed=5, overrides=SMALL)
    b = make_tiny_checkpoint(tmp_path / "b", seed=5, overrides=SMALL)
    c = make_tiny_checkpoint(tmp_path / "c", seed=6, overrides=SMALL)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_does_not_move_the_global_rng(tmp_path: Path) -> None:
    """Making a checkpoint leaves torch's global random state as it found it."""
    before = torch.random.get_rng_state()
    make_tiny_checkpoint(tmp_path, overrides=SMALL)
    assert torch.equal(before, torch.random.get_rng_state())


def test_weights_layout(tmp_path: Path) -> None:
    """Norms are 1, matrices have std ~ init_std, and a tied checkpoint stores no lm_head.weight while an
    untied one does."""
    tied = load_file(
        make_tiny_checkpoint(tmp_path / "tied", init_std=0.1, overrides=SMALL) / "model.safetensors"
    )
    assert "lm_head.weight" not in tied
    assert torch.equal(tied["model.norm.weight"], torch.ones(64))
    assert torch.equal(tied["model.layers.1.self_attn.k_norm.weight"], torch.ones(16))
    assert abs(tied["model.embed_tokens.weight"].std().item() - 0.1) < 0.01  # 256 * 64 draws
    untied_folder = make_tiny_checkpoint(tmp_path / "untied", tie_word_embeddings=False, overrides=SMALL)
    assert load_file(untied_folder / "model.safetensors")["lm_head.weight"].shape == (256, 64)
