"""ModelConfig read from Hugging Face Qwen3 folders, and the errors for folders it cannot serve."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from openinfer.engine_core.models.config import ModelConfig

BASE: dict[str, Any] = {
    "model_type": "qwen3",
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "eos_token_id": 7,
}


def write(folder: Path, config: dict[str, Any], generation: dict[str, Any] | None = None) -> Path:
    (folder / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def test_transformers_5_layout(tmp_path: Path) -> None:
    """rope_parameters.rope_theta, dtype, explicit head_dim, and EOS ids merged from both files in order."""
    config = {
        **BASE,
        "head_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "dtype": "bfloat16",
        "tie_word_embeddings": True,
    }
    mc = ModelConfig.from_folder(write(tmp_path, config, {"eos_token_id": [9, 7]}))
    assert (mc.rope_theta, mc.head_dim, mc.torch_dtype, mc.tie_word_embeddings) == (
        1e6,
        32,
        torch.bfloat16,
        True,
    )
    assert mc.eos_token_ids == (7, 9)


def test_transformers_4_layout(tmp_path: Path) -> None:
    """Top-level rope_theta and torch_dtype; head_dim defaults to hidden_size // heads (64 // 4)."""
    config = {**BASE, "rope_theta": 10000.0, "torch_dtype": "float32", "rope_scaling": None}
    mc = ModelConfig.from_folder(write(tmp_path, config))
    assert (mc.rope_theta, mc.head_dim, mc.torch_dtype, mc.eos_token_ids) == (
        10000.0,
        16,
        torch.float32,
        (7,),
    )
    assert not mc.tie_word_embeddings and not mc.attention_bias


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "llama"}, "only 'qwen3'"),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
            "'yarn' is not supported",
        ),
        ({"rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}}, "'linear' is not supported"),
        ({"num_key_value_heads": 3, "rope_theta": 1e4}, "multiple of num_key_value_heads"),
        ({"use_sliding_window": True, "rope_theta": 1e4}, "sliding-window"),
        ({}, "rope_theta"),
        ({"rope_theta": float("nan")}, "rope_theta must be a finite number > 0, got nan"),
        ({"rope_theta": float("inf")}, "rope_theta must be a finite number > 0, got inf"),
        ({"rope_theta": -1e4}, "rope_theta must be a finite number > 0"),
        ({"rope_theta": 1e4, "rms_norm_eps": float("nan")}, "rms_norm_eps must be a finite number > 0"),
        (
            {"rope_theta": 1e4, "eos_token_id": 1000},
            r"eos_token_id \[1000\] outside the vocabulary \(0..999\)",
        ),
        ({"rope_theta": 1e4, "eos_token_id": [7, -1]}, r"eos_token_id \[-1\] outside the vocabulary"),
        ({"rope_theta": 1e4, "hidden_size": "64"}, "hidden_size must be an integer, got '64'"),
        ({"rope_theta": 1e4, "vocab_size": 1000.5}, "vocab_size must be an integer, got 1000.5"),
        ({"rope_theta": 1e4, "num_attention_heads": 0}, "num_attention_heads must be an integer >= 1, got 0"),
        ({"rope_theta": 1e4, "num_hidden_layers": True}, "num_hidden_layers must be an integer, got True"),
    ],
)
def test_refused_configs(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    """Configs this engine cannot serve faithfully, or whose values are impossible (NaN or infinite RoPE
    base, an EOS id outside the vocabulary, a size that is not a positive integer), fail with an error naming
    the problem."""
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_folder(write(tmp_path, {**BASE, **change}))


def test_generation_config_eos_outside_the_vocabulary(tmp_path: Path) -> None:
    """generation_config.json's EOS ids are checked against the vocabulary too (1000 rows: 0..999)."""
    folder = write(tmp_path, {**BASE, "rope_theta": 1e4}, {"eos_token_id": [7, 151645]})
    with pytest.raises(ValueError, match=r"eos_token_id \[151645\] outside the vocabulary"):
        ModelConfig.from_folder(folder)


def test_a_fifo_config_is_refused_unread(tmp_path: Path) -> None:
    """config.json as a FIFO is refused by its type (never opened: reading one blocks until a writer comes);
    a generation_config.json FIFO as well, where before it was skipped as absent."""
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(ValueError, match="config.json is a FIFO, not a regular file"):
        ModelConfig.from_folder(tmp_path)
    (tmp_path / "config.json").unlink()
    write(tmp_path, {**BASE, "rope_theta": 1e4})
    os.mkfifo(tmp_path / "generation_config.json")
    with pytest.raises(ValueError, match="generation_config.json is a FIFO, not a regular file"):
        ModelConfig.from_folder(tmp_path)


def test_missing_config(tmp_path: Path) -> None:
    """A folder without config.json says what --model must point at."""
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_folder(tmp_path)
