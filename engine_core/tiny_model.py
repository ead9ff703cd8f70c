"""Tiny random Qwen3 checkpoints in Hugging Face format (test fixtures). TINY_QWEN3_CONFIG is also the
architecture of the built-in model, which is trained (tools/train_target.py; see builtin_model.py)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

# transformers' Qwen3Config arguments of the built-in model's architecture (read-only).
TINY_QWEN3_CONFIG: MappingProxyType[str, Any] = MappingProxyType(
    {
        "vocab_size": 512,  # the built-in tokenizer's vocabulary, specials included
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 768,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
        "eos_token_id": 0,  # <|endoftext|>
        "bos_token_id": None,
        "pad_token_id": 0,
    }
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def make_tiny_checkpoint(
    folder: Path | str,
    *,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    init_std: float = 0.2,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a random Qwen3 checkpoint (config.json, generation_config.json, model.safetensors) into
    `folder`, plus the built-in tokenizer files when the package has them. The same arguments always give
    the same weights: every matrix is drawn from N(0, init_std) by a generator seeded with `seed`, every
    norm weight is 1. init_std is wide on purpose, so that a random model's greedy output varies."""
    from transformers import Qwen3Config
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {**TINY_QWEN3_CONFIG, "tie_word_embeddings": tie_word_embeddings, "initializer_range": init_std}
    config = Qwen3Config(**{**kwargs, **(overrides or {})})
    with torch.random.fork_rng(devices=[]):  # transformers' own init must not move the global RNG
        model = HFQwen3ForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights are listed once
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * init_std)
    model.save_pretrained(folder)
    for name in _TOKENIZER_FILES:
        source = files("openinfer.engine_core") / "builtin" / name
        if source.is_file():
            (folder / name).write_bytes(source.read_bytes())
    return folder
