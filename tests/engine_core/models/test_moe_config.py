"""A Qwen3-MoE config.json read as transformers' Qwen3MoeConfig reads it."""

from __future__ import annotations

from typing import Any

import pytest

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash_config import DFlashConfig, zlab_target_layer_ids
from openinfer.engine_core.models.drafter_fit import check_fits_target

BASE: dict[str, Any] = {
    "model_type": "qwen3_moe", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 6, "num_attention_heads": 1, "max_position_embeddings": 8, "rope_theta": 1e4,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 4,
}  # fmt: skip


def test_layers_are_sparse_as_transformers_decides() -> None:
    """mlp_only_layers and decoder_sparse_step choose the sparse layers, as Qwen3MoeDecoderLayer does."""
    moe = ModelConfig.from_dict({**BASE, "decoder_sparse_step": 2, "mlp_only_layers": [3]}).moe
    assert moe is not None
    assert [moe.is_sparse(i) for i in range(6)] == [
        False,
        True,
        False,
        False,
        False,
        True,
    ]  # (i+1) % 2, not 3


def test_num_local_experts_and_defaults() -> None:
    """transformers 5 saves num_local_experts; absent fields take Qwen3MoeConfig's defaults; qwen3 is dense."""
    config = {k: v for k, v in BASE.items() if k != "num_experts"} | {"num_local_experts": 16}
    moe = ModelConfig.from_dict(config).moe
    assert moe is not None and (moe.num_experts, moe.norm_topk_prob, moe.decoder_sparse_step) == (
        16,
        False,
        1,
    )
    assert ModelConfig.from_dict({**BASE, "model_type": "qwen3"}).moe is None


def test_top_k_above_the_experts_is_refused() -> None:
    """num_experts_per_tok above num_experts is an error naming both."""
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(5\) must be in 1..num_experts \(4\)"):
        ModelConfig.from_dict({**BASE, "num_experts_per_tok": 5})


# Qwen3-Coder-30B-A3B-Instruct's config.json as released (the fields transformers' Qwen3MoeConfig reads).
CODER_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 5472, "max_position_embeddings": 262144, "mlp_only_layers": [],
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
    "rope_scaling": None, "rope_theta": 10000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
# A drafter for it in z-lab's DFlash layout: a dense Qwen3 stack with the fields z-lab's `dflash` code reads
# (block_size, dflash_config's mask_token_id and target_layer_ids, num_target_layers).
ZLAB_DFLASH_FOR_CODER: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 2048, "head_dim": 128,
    "intermediate_size": 6144, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 4,
    "max_position_embeddings": 262144, "rope_theta": 10000000, "vocab_size": 151936, "block_size": 16,
    "num_target_layers": 48, "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 12, 23, 34, 45]},
}  # fmt: skip


def test_qwen3_coder_30b_a3b_and_a_zlab_dflash_drafter_for_it() -> None:
    """The released Coder-30B-A3B config reads as 48 sparse layers of 128 experts (768 wide, top-8,
    renormalised); a z-lab-layout DFlash drafter for it fits (its target layers are z-lab's spread over 48),
    and the same drafter is refused on a target of another depth (Qwen3-8B's 36 layers)."""
    target = ModelConfig.from_dict(CODER_30B_A3B)
    assert target.moe is not None and all(target.moe.is_sparse(i) for i in range(48))
    assert (target.moe.num_experts, target.moe.num_experts_per_tok, target.moe.moe_intermediate_size) == (
        128,
        8,
        768,
    )
    assert target.moe.norm_topk_prob and target.eos_token_ids == (151645,)
    drafter = DFlashConfig.from_dict(ZLAB_DFLASH_FOR_CODER)
    assert drafter.target_layer_ids == zlab_target_layer_ids(48, 5) and drafter.block_size == 16
    check_fits_target(drafter, target)
    shallow = ModelConfig.from_dict({**CODER_30B_A3B, "num_hidden_layers": 36})
    with pytest.raises(ValueError, match="trained on a 48-layer target, this one has 36"):
        check_fits_target(drafter, shallow)
