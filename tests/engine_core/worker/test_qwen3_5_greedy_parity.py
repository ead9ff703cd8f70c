"""Greedy tokens of the engine core on Qwen3.5 (hybrid Gated DeltaNet) checkpoints equal transformers'
(invariant 1), through chunked prefill mixed with decodes; the released layout loads as the text-only one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core, mixed_length_prompts
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.qwen3_5_checkpoint import load_hf_text_model, make_tiny_qwen3_5_checkpoint

LINEAR, FULL = "linear_attention", "full_attention"
CONFIGS: dict[str, dict[str, Any]] = {
    "dense-3-linear-1-full": {"moe": False, "overrides": {}},
    "dense-full-first": {"moe": False, "overrides": {"layer_types": [FULL, LINEAR, FULL, LINEAR]}},
    "dense-interval-2-gqa1": {
        "moe": False,
        "overrides": {"layer_types": None, "full_attention_interval": 2, "linear_num_value_heads": 2},
    },
    "moe-shared-expert": {"moe": True, "overrides": {}},
}


@pytest.mark.parametrize("case", CONFIGS.values(), ids=CONFIGS.keys())
def test_qwen3_5_greedy_matches_transformers(tmp_path: Path, case: dict[str, Any]) -> None:
    """8 mixed prompts in one batch, prefill chunked (64 tokens a step) among decodes, every norm weight
    random (the zero-centred 1 + w): transformers' greedy tokens, teacher-forced."""
    folder = make_tiny_qwen3_5_checkpoint(tmp_path / "q", seed=3, **case)
    prompts = mixed_length_prompts(8)
    outputs = generate_greedy(make_core(folder, max_num_batched_tokens=64), prompts, max_tokens=16)
    assert sum(len(set(o)) for o in outputs) > 8 * 4  # not one repeated token per request
    assert_hf_greedy(folder, prompts, outputs, load_hf_text_model)


def test_released_and_text_only_layouts_serve_the_same_tokens(tmp_path: Path) -> None:
    """The released layout (text under model.language_model., a vision tower and mtp.* beside it; bf16, 2
    shards + index) and a text-only ForCausalLM folder of the same weights: one batch's tokens are equal."""
    kwargs: dict[str, Any] = {"seed": 4, "dtype": torch.bfloat16}
    released = make_tiny_qwen3_5_checkpoint(tmp_path / "released", num_shards=2, **kwargs)
    text_only = make_tiny_qwen3_5_checkpoint(tmp_path / "text", layout="causal_lm", **kwargs)
    assert (released / "model.safetensors.index.json").is_file()
    prompts = mixed_length_prompts(4)
    tokens = [
        generate_greedy(make_core(f, dtype="float32"), prompts, max_tokens=8) for f in (released, text_only)
    ]
    assert tokens[0] == tokens[1]


def test_a_missing_text_tensor_is_named(tmp_path: Path) -> None:
    """A released folder without one DeltaNet tensor is refused at load, naming it."""
    from safetensors.torch import load_file, save_file

    folder = make_tiny_qwen3_5_checkpoint(tmp_path / "q", seed=1)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.language_model.layers.0.linear_attn.A_log"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.0\.linear_attn\.A_log"):
        make_core(folder)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_matches_transformers_in_the_same_dtype(tmp_path: Path, dtype: torch.dtype) -> None:
    """A checkpoint served in bf16 or fp16 (weights, conv state and activations in it, the recurrent state in
    float32 as transformers keeps it): transformers' greedy tokens run in that dtype, teacher-forced."""
    folder = make_tiny_qwen3_5_checkpoint(tmp_path / "q", seed=3, dtype=dtype)
    prompts = mixed_length_prompts(4)
    name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    outputs = generate_greedy(make_core(folder, dtype=name), prompts, max_tokens=6)
    assert_hf_greedy(folder, prompts, outputs, lambda f: load_hf_text_model(f).to(dtype))
