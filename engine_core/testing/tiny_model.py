"""Tiny random Qwen3 checkpoints in Hugging Face format (test fixtures). TINY_QWEN3_CONFIG is also the
architecture of the built-in model, which is trained (tools/train_target.py; see builtin_model.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
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
# Overrides for a test model smaller than the built-in one (its 4 query over 2 KV heads, GQA, kept).
SMALL_QWEN3: MappingProxyType[str, Any] = MappingProxyType(
    {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "head_dim": 16, "intermediate_size": 128}
)
# Overrides for a test model as small as SMALL_QWEN3 that keeps the built-in tokenizer's vocabulary (512), so
# that text prompts work; its 2 layers still give greedy output that varies (the parity tests' model).
SMALL_TEXT_QWEN3: MappingProxyType[str, Any] = MappingProxyType(
    {"hidden_size": 64, "num_hidden_layers": 2, "head_dim": 16, "intermediate_size": 128}
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def unfilled_model(model_class: Any, config: Any) -> Any:
    """A transformers model of ``model_class`` on the CPU with uninitialised parameters (built on the meta
    device: transformers' own init, seconds at real widths and draws from the global RNG, is skipped), its
    tied weights tied again; the caller writes every parameter."""
    with torch.device("meta"):
        model = model_class(config)
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gave every parameter new storage: a tied head shares the embedding again
    return model


def random_model(model_class: Any, config: Any, seed: int, init_std: float, dtype: torch.dtype) -> Any:
    """A transformers model of ``model_class`` whose every matrix is drawn from N(0, init_std) by a generator
    seeded with ``seed`` (every norm weight 1), in ``dtype`` (see ``unfilled_model``)."""
    model = unfilled_model(model_class, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights are listed once
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, init_std, generator=generator)  # = randn(shape) * init_std
            param.data = param.data.to(dtype)  # drawn in float32, saved in dtype
    return model


def make_tiny_checkpoint(
    folder: Path | str,
    *,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    init_std: float = 0.2,
    overrides: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    num_shards: int = 1,
) -> Path:
    """Write a random Qwen3 checkpoint (config.json, generation_config.json, model.safetensors) into
    `folder`, plus the built-in tokenizer files when the package has them. The same arguments always give
    the same weights: every matrix is drawn from N(0, init_std) by a generator seeded with `seed`, every
    norm weight is 1. init_std is wide on purpose, so that a random model's greedy output varies.

    The weights are drawn in float32 and saved in `dtype` (config.json says which). `num_shards` > 1
    splits them, in checkpoint order, into that many `model-0000i-of-0000n.safetensors` files of about
    equal size with a `model.safetensors.index.json`, the layout of Hugging Face's larger checkpoints."""
    from transformers import Qwen3Config
    from transformers import Qwen3ForCausalLM as HFQwen3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {**TINY_QWEN3_CONFIG, "tie_word_embeddings": tie_word_embeddings, "initializer_range": init_std}
    config = Qwen3Config(**{**kwargs, **(overrides or {})})
    model = random_model(HFQwen3ForCausalLM, config, seed, init_std, dtype)
    model.save_pretrained(folder)
    return finish_checkpoint(folder, num_shards)


def finish_checkpoint(folder: Path, num_shards: int) -> Path:
    """Split the weights saved in `folder` into `num_shards` files (see shard_safetensors) when more than one,
    and copy the built-in tokenizer files in when the package has them. Returns `folder`."""
    if num_shards > 1:
        shard_safetensors(folder, num_shards)
    for name in _TOKENIZER_FILES:
        source = files("openinfer.engine_core") / "builtin" / name
        if source.is_file():
            (folder / name).write_bytes(source.read_bytes())
    return folder


def shard_safetensors(folder: Path, num_shards: int) -> None:
    """Split folder/model.safetensors into `num_shards` files plus the index that names each tensor's."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    if len(tensors) < num_shards:
        raise ValueError(f"{len(tensors)} tensors cannot fill {num_shards} shards")
    total_size = sum(t.nbytes for t in tensors.values())
    names = list(tensors)
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    k, written = 0, 0  # the shard being filled; bytes placed so far
    for i, name in enumerate(names):
        full = written * num_shards >= (k + 1) * total_size  # shard k holds its 1/n of the bytes
        must_move = len(names) - i == num_shards - 1 - k  # one tensor left for each later shard
        if shards[k] and k < num_shards - 1 and (full or must_move):
            k += 1
        shards[k].append(name)
        written += tensors[name].nbytes
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{num_shards:05d}.safetensors"
        save_file({name: tensors[name] for name in shard}, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (folder / "model.safetensors").unlink()
