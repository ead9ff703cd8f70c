"""Tiny random drafters in DeepSeek's DeepSpec checkpoint layout (`Qwen3DSparkModel`: DSpark, or DeepSpec's
DFlash with markov_rank 0), sized for a given target (tests, demos)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.drafter_values import DEEPSPEC_ARCHITECTURE
from openinfer.engine_core.models.dspark_heads import SAMPLED_CONFIDENCE_FILE, MarkovHeadType
from openinfer.engine_core.models.weights import iter_safetensors
from openinfer.engine_core.testing.dflash_checkpoint import (
    drafter_parameters,
    qwen3_drafter_config,
    random_drafter_tensors,
    write_dflash_checkpoint,
)

# Draft blocks per training sequence: tools/train_dspark.py's default --anchors (DeepSpec's configs use 512).
DEFAULT_NUM_ANCHORS = 48


def make_tiny_dspark_checkpoint(
    folder: Path | str,
    target_folder: Path | str,
    *,
    num_layers: int = 1,
    block_size: int = 7,
    target_layer_ids: tuple[int, ...] | None = None,
    markov_rank: int = 16,
    markov_head_type: MarkovHeadType = MarkovHeadType.VANILLA,
    confidence_head: bool = True,
    confidence_with_markov: bool = True,
    seed: int = 0,
    init_std: float = 0.2,
) -> Path:
    """Write config.json and model.safetensors of a random drafter in DeepSpec's layout for the Qwen3
    checkpoint in `target_folder`: the target's config with DeepSpec's top-level fields, num_layers draft
    layers of its sizes, its embedding and LM head copied in (as DeepSpec's save_pretrained writes them),
    and the heads asked for (markov_rank 0 and no confidence head: DeepSpec's DFlash drafters).

    The same arguments always give the same bytes: every drafted matrix is drawn from N(0, init_std) by a
    generator seeded with `seed`, in parameter order; every norm weight is 1; the mask token is the last
    vocabulary id."""
    config = dspark_checkpoint_config(
        ModelConfig.from_folder(target_folder),
        num_layers=num_layers,
        block_size=block_size,
        target_layer_ids=target_layer_ids,
        markov_rank=markov_rank,
        markov_head_type=markov_head_type,
        confidence_head=confidence_head,
        confidence_with_markov=confidence_with_markov,
    )
    tensors = random_drafter_tensors(config, seed=seed, init_std=init_std)
    return write_dspark_checkpoint(folder, config, tensors, target_folder)


def write_dspark_checkpoint(
    folder: Path | str, config: dict[str, Any], tensors: dict[str, torch.Tensor], target_folder: Path | str
) -> Path:
    """Write config.json and model.safetensors: the drafter's `tensors` by their DeepSpec names plus copies
    of the target's embedding and LM head (as DeepSpec's save_pretrained writes them)."""
    target_tensors = dict(iter_safetensors(Path(target_folder)))
    embedding = target_tensors["model.embed_tokens.weight"]
    head = target_tensors.get("lm_head.weight")  # absent when the target ties it to the embedding
    copies = {
        "embed_tokens.weight": embedding,
        "lm_head.weight": (embedding if head is None else head).clone(),
    }
    return write_dflash_checkpoint(folder, config, {**tensors, **copies})


def dspark_checkpoint_config(
    target: ModelConfig,
    *,
    num_layers: int,
    block_size: int,
    target_layer_ids: tuple[int, ...] | None = None,
    markov_rank: int,
    markov_head_type: MarkovHeadType,
    confidence_head: bool,
    confidence_with_markov: bool,
    mask_token_id: int | None = None,
    num_anchors: int = DEFAULT_NUM_ANCHORS,
) -> dict[str, Any]:
    """The config.json DeepSpec writes for a drafter of `target` (the defaults are
    `make_tiny_dspark_checkpoint`'s): the target's Qwen3 fields, num_hidden_layers the draft's, DeepSpec's
    fields at the top level (mask_token_id defaults to the last vocabulary id; `num_anchors`, the draft
    blocks per training sequence, which DeepSpec's `Qwen3DSparkModel` requires though inference never reads
    it), `markov_head_type` only with a Markov head and `confidence_head_with_markov` only with a confidence
    head, as DeepSpec's config builder writes them."""
    config = qwen3_drafter_config(target, num_layers, block_size, target_layer_ids, mask_token_id)
    config.update(
        architectures=[DEEPSPEC_ARCHITECTURE],
        layer_types=["full_attention"] * num_layers,
        markov_rank=markov_rank,
        enable_confidence_head=confidence_head,
        num_anchors=num_anchors,
    )
    if markov_rank > 0:
        config["markov_head_type"] = markov_head_type.value
    if confidence_head:
        config["confidence_head_with_markov"] = confidence_with_markov
    return config


def dspark_from_dflash(
    dflash_folder: Path | str,
    folder: Path | str,
    target_folder: Path | str,
    *,
    markov_rank: int = 8,
    seed: int = 0,
) -> Path:
    """A DSpark checkpoint in DeepSpec's layout around the backbone of a z-lab anchor-slot DFlash drafter
    (its layers, fc and norms as they are), with a vanilla Markov head whose bias is small (markov_w2 drawn
    from N(0, 0.01)), so its drafts stay close to the DFlash drafter's, and a random confidence head. Block
    size the same: every one of its slots drafts."""
    zlab = DFlashConfig.from_folder(dflash_folder)
    config = dspark_checkpoint_config(
        ModelConfig.from_folder(target_folder),
        num_layers=zlab.layers.num_hidden_layers,
        block_size=zlab.block_size,
        target_layer_ids=zlab.target_layer_ids,
        markov_rank=markov_rank,
        markov_head_type=MarkovHeadType.VANILLA,
        confidence_head=True,
        confidence_with_markov=True,
        mask_token_id=zlab.mask_token_id,
    )
    tensors = dict(iter_safetensors(Path(dflash_folder)))
    generator = torch.Generator().manual_seed(seed)
    for name, param in drafter_parameters(config):
        if name.startswith(("markov_head.", "confidence_head.")):
            std = 0.01 if name == "markov_head.markov_w2.weight" else 0.5
            tensors[name] = torch.randn(param.shape, generator=generator) * std
    return write_dspark_checkpoint(folder, config, tensors, target_folder)


def write_sampled_confidence(folder: Path | str, temperature: float, weight: Tensor, bias: Tensor) -> Path:
    """Give a DSpark folder its second confidence head (dspark_heads.py): `weight` (1, in_features) and `bias`
    (1,) in SAMPLED_CONFIDENCE_FILE, fitted at `temperature`, which config.json's
    `sampled_confidence_temperature` names. model.safetensors is left as DeepSpec's loader reads it."""
    folder = Path(folder)
    tensors = {"sampled_confidence_head.proj.weight": weight, "sampled_confidence_head.proj.bias": bias}
    save_file(
        {k: v.detach().float().contiguous() for k, v in tensors.items()}, folder / SAMPLED_CONFIDENCE_FILE
    )
    config = json.loads((folder / "config.json").read_text())
    config["sampled_confidence_temperature"] = temperature
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder
