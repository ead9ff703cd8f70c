"""Every DeepSpec-layout drafter config openinfer writes or ships carries what DeepSpec's own loader asks
for: read through transformers' config class as DeepSpec's ``from_pretrained`` reads it, each field its
``Qwen3DSparkModel.__init__`` asserts present (``target_layer_ids``, ``mask_token_id``, ``num_anchors``,
``enable_confidence_head``, ``markov_rank``; ``markov_head_type`` with a Markov head,
``confidence_head_with_markov`` with a confidence head) is there with the type it converts it to, and the
fields its layers and block read (``block_size``, a ``layer_types`` entry per draft layer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig, PretrainedConfig

from openinfer.engine_core.builtin_model import builtin_drafter_folder, builtin_target_folder
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dspark_heads import MarkovHeadType
from openinfer.engine_core.testing.dspark_checkpoint import (
    dspark_checkpoint_config,
    dspark_from_dflash,
    make_tiny_dspark_checkpoint,
)

# Qwen3DSparkModel.__init__'s `required_fields` (DeepSpec, deepspec/modeling/dspark/qwen3/modeling.py)
REQUIRED = ("target_layer_ids", "mask_token_id", "num_anchors", "enable_confidence_head", "markov_rank")


def check_deepspec_fields(config: PretrainedConfig) -> None:
    """What DeepSpec's constructor asserts and converts, on a config as transformers loads it."""
    missing = [field for field in REQUIRED if not hasattr(config, field)]
    assert not missing, f"DeepSpec's Qwen3DSparkModel asserts these present: {missing}"
    assert int(config.num_anchors) >= 1 and int(config.block_size) >= 1
    assert isinstance(config.mask_token_id, int) and list(config.target_layer_ids)
    if int(config.markov_rank) > 0:
        assert config.markov_head_type in {t.value for t in MarkovHeadType}
    if bool(config.enable_confidence_head):
        assert isinstance(config.confidence_head_with_markov, bool)
    assert config.layer_types == ["full_attention"] * config.num_hidden_layers  # layer i reads layer_types[i]
    assert config.architectures == ["Qwen3DSparkModel"]


@pytest.mark.parametrize("name", ["dspark_block7", "dflash_block7"])
def test_the_shipped_drafters(name: str) -> None:
    """The built-in DSpark and DeepSpec-DFlash folders (num_anchors: the 48 blocks a sequence they were
    trained with)."""
    folder = builtin_drafter_folder("dspark").parent / name
    check_deepspec_fields(AutoConfig.from_pretrained(folder))
    assert json.loads((folder / "config.json").read_text())["num_anchors"] == 48


@pytest.mark.parametrize(("markov_rank", "confidence_head"), [(16, True), (16, False), (0, True), (0, False)])
def test_the_configs_openinfer_writes(tmp_path: Path, markov_rank: int, confidence_head: bool) -> None:
    """tools/train_dspark.py's config (its --anchors as num_anchors), the test builders' checkpoints and
    dspark_from_dflash's, with and without each head."""
    target = builtin_target_folder()
    written = dspark_checkpoint_config(
        ModelConfig.from_folder(target),
        num_layers=2,
        block_size=7,
        markov_rank=markov_rank,
        markov_head_type=MarkovHeadType.VANILLA,
        confidence_head=confidence_head,
        confidence_with_markov=confidence_head and markov_rank > 0,
        num_anchors=512,
    )
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "config.json").write_text(json.dumps(written))
    folders = [
        tmp_path / "tool",
        make_tiny_dspark_checkpoint(
            tmp_path / "tiny",
            target,
            markov_rank=markov_rank,
            confidence_head=confidence_head,
            confidence_with_markov=confidence_head and markov_rank > 0,
        ),
        dspark_from_dflash(builtin_drafter_folder("dflash"), tmp_path / "converted", target),
    ]
    for folder in folders:
        check_deepspec_fields(AutoConfig.from_pretrained(folder))
    assert AutoConfig.from_pretrained(tmp_path / "tool").num_anchors == 512
