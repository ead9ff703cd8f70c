"""Tiny random Qwen3-MoE checkpoints in Hugging Face format (test and benchmark fixtures), the experts' weights
per expert as released checkpoints name them or stacked as transformers 5 holds them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from safetensors.torch import save_file

from openinfer.engine_core.testing.tiny_model import TINY_QWEN3_CONFIG, finish_checkpoint, random_model

# transformers' Qwen3MoeConfig arguments of a small MoE model over the built-in tokenizer's vocabulary (512):
# 2 layers, 8 experts of width 32, top-2, every layer sparse (read-only).
SMALL_QWEN3_MOE: MappingProxyType[str, Any] = MappingProxyType(
    {
        **TINY_QWEN3_CONFIG,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "head_dim": 16,
        "intermediate_size": 128,  # the dense layers' MLP (mlp_only_layers, off the decoder_sparse_step)
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
)


def make_tiny_moe_checkpoint(
    folder: Path | str,
    *,
    seed: int = 0,
    init_std: float = 0.2,
    overrides: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    stacked_experts: bool = False,
    num_shards: int = 1,
) -> Path:
    """Write a random Qwen3-MoE checkpoint of SMALL_QWEN3_MOE (+ `overrides`) into `folder`: config.json,
    generation_config.json, the weights in `dtype` and the built-in tokenizer files when the package has them.

    The same arguments always give the same weights (every matrix from N(0, init_std), drawn in parameter
    order by a generator seeded with `seed`; every norm weight 1), whichever form they are saved in:
    per expert (`mlp.experts.E.gate_proj.weight`, what `save_pretrained` writes) or, with `stacked_experts`,
    transformers 5's stacked tensors (`mlp.experts.gate_up_proj` (E, 2 * I, H), `mlp.experts.down_proj`).
    `num_shards` > 1 splits the weights into that many files with a `model.safetensors.index.json`."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen3MoeConfig(**{**SMALL_QWEN3_MOE, "initializer_range": init_std, **(overrides or {})})
    model = random_model(Qwen3MoeForCausalLM, config, seed, init_std, dtype)
    model.save_pretrained(folder)  # per expert: transformers 5 splits the stacked experts on saving
    if stacked_experts:
        tensors = {name: param.detach().contiguous() for name, param in model.named_parameters()}
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return finish_checkpoint(folder, num_shards)
