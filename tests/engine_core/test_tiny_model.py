"""Tiny checkpoints: deterministic, in Hugging Face's format, and the cached built-in model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import openinfer.engine_core.tiny_model as tiny_model
from openinfer.engine_core.model_runner import ModelRunner, SeqChunk
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.tiny_model import TINY_QWEN3_CONFIG, ensure_builtin_model, make_tiny_checkpoint

SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "head_dim": 16,
    "intermediate_size": 128,
}


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


def test_builtin_config_is_what_the_engine_reads(tmp_path: Path) -> None:
    """ensure_builtin_model writes the documented architecture (EOS 0), reuses the folder on the next call,
    and leaves no temporary folders behind."""
    folder = ensure_builtin_model(tmp_path)
    config = ModelConfig.from_folder(folder)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.head_dim) == (
        512,
        256,
        4,
        64,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.intermediate_size) == (4, 2, 768)
    assert config.eos_token_ids == (0,) and config.tie_word_embeddings and config.rope_theta == 10000.0
    assert json.loads((folder / "config.json").read_text())["bos_token_id"] is None
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_builtin_model(tmp_path) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def test_builtin_model_greedy_output_varies(tmp_path: Path) -> None:
    """16 greedy steps of the built-in random model do not repeat one token (init_std is wide enough)."""
    runner = ModelRunner(ensure_builtin_model(tmp_path), torch.device("cpu"), num_kv_blocks=4, block_size=16)
    blocks = [2, 3]  # 32 slots for 3 + 16 tokens
    tokens = [5, 6, 7]
    next_token = int(runner.execute([SeqChunk(tokens, 0, blocks)])[0].argmax())
    for _ in range(15):
        tokens.append(next_token)
        next_token = int(runner.execute([SeqChunk([next_token], len(tokens) - 1, blocks)])[0].argmax())
    tokens.append(next_token)
    assert len(set(tokens[3:])) > 2


def test_builtin_model_race_loser_uses_the_winners_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When another process renames its copy into place first, ensure_builtin_model returns that folder
    and removes its own temporary copy."""
    real = tiny_model.make_tiny_checkpoint

    def racing(folder: Path, **kwargs: object) -> Path:
        winner = tmp_path / f"tiny-qwen3-{tiny_model._builtin_digest()}"
        real(winner, overrides=SMALL)  # the other process finishes first
        return real(folder, overrides=SMALL)

    monkeypatch.setattr(tiny_model, "make_tiny_checkpoint", racing)
    folder = ensure_builtin_model(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    assert ModelConfig.from_folder(folder).hidden_size == 64  # the winner's copy


def test_builtin_model_honours_openinfer_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit cache_dir, the built-in model goes under $OPENINFER_CACHE."""
    monkeypatch.setenv("OPENINFER_CACHE", str(tmp_path))
    folder = ensure_builtin_model()
    assert folder.parent == tmp_path and folder.name.startswith("tiny-qwen3-")
    assert TINY_QWEN3_CONFIG["vocab_size"] == 512
