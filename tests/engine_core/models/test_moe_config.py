"""A Qwen3-MoE config.json read as transformers' Qwen3MoeConfig reads it."""

from __future__ import annotations

from typing import Any

import pytest

from openinfer.engine_core.models.config import ModelConfig

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
