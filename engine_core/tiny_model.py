"""Tiny random Qwen3 checkpoints in Hugging Face format: the built-in demo model and test fixtures."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib.resources import files
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

# transformers' Qwen3Config arguments of the built-in model (read-only).
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
BUILTIN_SEED = 0
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_FORMAT_VERSION = 1  # bump when make_tiny_checkpoint's output changes for the same arguments


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


def ensure_builtin_model(cache_dir: Path | None = None) -> Path:
    """The built-in model's folder, made on first use under `cache_dir`, else $OPENINFER_CACHE, else
    ~/.cache/openinfer. Safe when several processes race: each builds in a temporary folder and renames it
    into place; the first rename wins and the others discard their copy."""
    root = Path(cache_dir or os.environ.get("OPENINFER_CACHE") or Path.home() / ".cache" / "openinfer")
    final = root / f"tiny-qwen3-{_builtin_digest()}"
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=".tiny-qwen3-", dir=root))
    try:
        make_tiny_checkpoint(temp, seed=BUILTIN_SEED)
        os.rename(temp, final)
    except OSError:
        if not final.is_dir():
            raise
        # Another process renamed its copy into place first; theirs is identical.
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return final


def _builtin_digest() -> str:
    """Short hash of everything the built-in folder is made from, tokenizer included."""
    h = hashlib.sha256()
    h.update(
        json.dumps({**TINY_QWEN3_CONFIG, "seed": BUILTIN_SEED, "v": _FORMAT_VERSION}, sort_keys=True).encode()
    )
    for name in _TOKENIZER_FILES:
        source = files("openinfer.engine_core") / "builtin" / name
        h.update(source.read_bytes() if source.is_file() else b"")
    return h.hexdigest()[:12]
