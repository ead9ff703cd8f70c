"""tools/train_dflash.py trains the engine's own drafter: its many-blocks training forward proposes exactly
what the engine's DFlashDrafter proposes from the written checkpoint, in both anchor layouts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from openinfer.tools import dflash_card, dflash_data

SMALL = {**SMALL_TEXT_QWEN3, "num_hidden_layers": 3}


@pytest.mark.parametrize("anchor", list(AnchorLayout))
def test_training_forward_is_the_engines(tmp_path: Path, anchor: AnchorLayout) -> None:
    """On random sequences, check_against_engine finds the engine's proposals equal to the argmax of
    draft_logits at an anchor of each (it raises otherwise)."""
    target_folder = make_tiny_checkpoint(tmp_path / "target", seed=2, overrides=SMALL)
    folder = make_tiny_dflash_checkpoint(
        tmp_path / "draft",
        target_folder,
        seed=3,
        num_layers=2,
        block_size=8,
        target_layer_ids=(0, 1),
        anchor=anchor,
    )
    config = DFlashConfig.from_folder(folder)
    model = DFlashDraftModel(config)
    model.load_weights(folder)
    target = dflash_data.load_target(target_folder)
    assert isinstance(target, Qwen3ForCausalLM)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, 512, (3, dflash_data.SEQ_LEN), generator=generator)
    features, _ = dflash_data.context_features(target, tokens, [0, 1])
    data = dflash_data.Distillation(tokens, torch.tensor([8, 32, 64]), features)
    args = argparse.Namespace(block_size=8, mask_token_id=config.mask_token_id, anchor=anchor)
    forward = dflash_card.zlab_block_logits(model, target, data, args)
    assert dflash_card.check_against_engine(folder, target_folder, model, data, args, 7, forward) == 3
