"""Greedy tokens of the engine core on Qwen3-MoE checkpoints equal transformers' (invariant 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core, mixed_length_prompts
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint

CONFIGS: dict[str, dict[str, Any]] = {
    "topk2-normalised": {"norm_topk_prob": True},
    "topk3-unnormalised": {"norm_topk_prob": False, "num_experts_per_tok": 3},
    "dense-first-layer": {"num_hidden_layers": 3, "mlp_only_layers": [0]},
    "sparse-step-2": {"num_hidden_layers": 3, "decoder_sparse_step": 2},
}


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_moe_greedy_matches_transformers(tmp_path: Path, overrides: dict[str, Any]) -> None:
    """8 mixed prompts in one batch, prefill chunked (64 tokens a step) among decodes: HF's greedy tokens."""
    folder = make_tiny_moe_checkpoint(tmp_path / "moe", seed=3, overrides=overrides)
    prompts = mixed_length_prompts(8)
    outputs = generate_greedy(make_core(folder, max_num_batched_tokens=64), prompts, max_tokens=16)
    assert sum(len(set(o)) for o in outputs) > 8 * 4  # not one repeated token per request
    assert_hf_greedy(folder, prompts, outputs)


def test_per_expert_and_stacked_checkpoints_serve_the_same_tokens(tmp_path: Path) -> None:
    """The released per-expert names (bf16, 2 shards + index) and transformers 5's stacked tensors load the
    same weights: one batch's greedy tokens are equal."""
    kwargs: dict[str, Any] = {"seed": 4, "dtype": torch.bfloat16}
    per_expert = make_tiny_moe_checkpoint(tmp_path / "per_expert", num_shards=2, **kwargs)
    stacked = make_tiny_moe_checkpoint(tmp_path / "stacked", stacked_experts=True, **kwargs)
    assert (per_expert / "model.safetensors.index.json").is_file()
    prompts = mixed_length_prompts(4)
    tokens = [
        generate_greedy(make_core(f, dtype="float32"), prompts, max_tokens=8) for f in (per_expert, stacked)
    ]
    assert tokens[0] == tokens[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_moe_greedy_matches_transformers_on_cuda(tmp_path: Path) -> None:
    """On CUDA in float32 (the Triton fused-MoE kernel, decode in CUDA graphs) the batch's tokens are HF's."""
    folder = make_tiny_moe_checkpoint(tmp_path / "moe", seed=3, overrides={"num_experts_per_tok": 3})
    prompts = mixed_length_prompts(8)
    core = make_core(folder, device="cuda:0", dtype="float32", max_num_batched_tokens=64)
    assert_hf_greedy(folder, prompts, generate_greedy(core, prompts, max_tokens=16))
