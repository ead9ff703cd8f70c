"""Tiny random DFlash drafters in z-lab's checkpoint layout, sized for a given target (tests, demos)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig, zlab_target_layer_ids
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint


def make_tiny_dflash_checkpoint(
    folder: Path | str,
    target_folder: Path | str,
    *,
    seed: int = 0,
    num_layers: int = 1,
    block_size: int = 8,
    target_layer_ids: tuple[int, ...] | None = None,
    mask_token_id: int | None = None,
    init_std: float = 0.2,
    anchor: AnchorLayout | None = AnchorLayout.MASK_SLOTS,
) -> Path:
    """Write config.json and model.safetensors of a random DFlash drafter for the Qwen3 checkpoint in
    `target_folder` into `folder`: its layers have the target's sizes, num_layers of them.

    The same arguments always give the same bytes: every matrix is drawn from N(0, init_std) by a generator
    seeded with `seed`, in parameter order; every norm weight is 1. target_layer_ids defaults to z-lab's
    choice (num_layers == 1: the middle layer; else evenly from layer 1 to layer n - 3), mask_token_id to the
    last vocabulary id. `anchor` is written as dflash_config.sample_from_anchor; None leaves the key out, as
    z-lab's published configs do."""
    target = ModelConfig.from_folder(target_folder)
    config = dflash_checkpoint_config(
        target,
        num_layers=num_layers,
        block_size=block_size,
        target_layer_ids=target_layer_ids,
        mask_token_id=mask_token_id,
        anchor=anchor,
    )
    return write_dflash_checkpoint(
        folder, config, random_drafter_tensors(config, seed=seed, init_std=init_std)
    )


def drafter_parameters(config: dict[str, Any]) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """The parameters of the drafter `config` describes, by name, on the meta device (names and shapes only)."""
    with torch.device("meta"):
        model = DFlashDraftModel(DFlashConfig.from_dict(config))
    return model.named_parameters()


def random_drafter_tensors(config: dict[str, Any], *, seed: int, init_std: float) -> dict[str, torch.Tensor]:
    """Every weight of the drafter `config` describes: each matrix drawn from N(0, init_std) by a generator
    seeded with `seed`, in parameter order; each norm weight 1."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, param in drafter_parameters(config):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(param.shape)
        else:
            tensors[name] = torch.randn(param.shape, generator=generator) * init_std
    return tensors


def dflash_checkpoint_config(
    target: ModelConfig,
    *,
    num_layers: int,
    block_size: int,
    target_layer_ids: tuple[int, ...] | None = None,
    mask_token_id: int | None = None,
    anchor: AnchorLayout | None = AnchorLayout.MASK_SLOTS,
) -> dict[str, Any]:
    """The config.json of a z-lab DFlash drafter with num_layers layers of `target`'s sizes (the defaults are
    `make_tiny_dflash_checkpoint`'s)."""
    config = qwen3_drafter_config(target, num_layers, block_size, target_layer_ids, mask_token_id)
    # z-lab's layout nests what the drafter reads of the target under dflash_config
    dflash_config = {key: config.pop(key) for key in ("mask_token_id", "target_layer_ids")}
    if anchor is not None:
        dflash_config["sample_from_anchor"] = anchor is AnchorLayout.ANCHOR_SLOT
    return {**config, "architectures": ["DFlashDraftModel"], "dflash_config": dflash_config}


def qwen3_drafter_config(
    target: ModelConfig,
    num_layers: int,
    block_size: int,
    target_layer_ids: tuple[int, ...] | None,
    mask_token_id: int | None,
) -> dict[str, Any]:
    """What a drafter's config.json says in either layout (z-lab's, DeepSpec's), at its top level: num_layers
    Qwen3 layers of `target`'s sizes, the block size, and the target layers it reads (default: z-lab's choice)
    and its mask token (default: the last vocabulary id)."""
    return {
        "model_type": "qwen3",
        "block_size": block_size,
        "num_target_layers": target.num_hidden_layers,
        "mask_token_id": target.vocab_size - 1 if mask_token_id is None else mask_token_id,
        "target_layer_ids": list(
            target_layer_ids or zlab_target_layer_ids(target.num_hidden_layers, num_layers)
        ),
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "max_position_embeddings": target.max_position_embeddings,
        "attention_bias": target.attention_bias,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def write_dflash_checkpoint(
    folder: Path | str, config: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> Path:
    """Write config.json and model.safetensors (`tensors` by their z-lab names, float32) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    contiguous = {name: t.detach().to(torch.float32).contiguous() for name, t in tensors.items()}
    save_file(contiguous, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def make_accepting_dflash_pair(folder: Path) -> tuple[Path, Path]:
    """A target that tends to repeat (narrow init) and a near-identity DFlash drafter in the anchor-slot
    layout, written under ``folder`` as ``t`` and ``d``: many of its drafts are accepted, in whole or in part,
    so tests reach accepted draft positions. Returns (target folder, drafter folder)."""
    target = make_tiny_checkpoint(folder / "t", seed=5, init_std=0.1, overrides=SMALL_TEXT_QWEN3)
    draft = make_tiny_dflash_checkpoint(
        folder / "d", target, seed=1, block_size=8, target_layer_ids=(0,), init_std=0.02,
        anchor=AnchorLayout.ANCHOR_SLOT,
    )  # fmt: skip
    return target, draft
