"""Qwen3.5 configs read as transformers 5.24 reads them (both layouts, dense and MoE), the checkpoint name map,
and the tiny Qwen3.5 checkpoints the parity tests are built on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.drafter_fit import check_fits_target
from openinfer.engine_core.models.hybrid_config import text_weight_name
from openinfer.engine_core.testing.qwen3_5_checkpoint import (
    load_hf_text_model,
    make_tiny_qwen3_5_checkpoint,
    mtp_shapes,
)

L, F = "linear_attention", "full_attention"
# A released Qwen3.5-27B config.json's shape (its text_config shrunk to 4 layers): what config.json holds.
TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 4, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "layer_types": [L, L, L, F], "full_attention_interval": 4, "attn_output_gate": True,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 48, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "eos_token_id": 248044, "dtype": "bfloat16", "tie_word_embeddings": False,
    "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False, "mamba_ssm_dtype": "float32",
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25},
}  # fmt: skip
RELEASED: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "dtype": "bfloat16",
    "image_token_id": 248056, "tie_word_embeddings": False, "text_config": TEXT,
    "vision_config": {"model_type": "qwen3_5", "depth": 27, "hidden_size": 1152, "out_hidden_size": 5120},
}  # fmt: skip
MOE_TEXT: dict[str, Any] = {
    **{k: v for k, v in TEXT.items() if k != "intermediate_size"}, "model_type": "qwen3_5_moe_text",
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
}  # fmt: skip


def test_released_config_is_read_through_its_text_config() -> None:
    """A conditional config is its text_config's model; vision_config and the mrope keys are not refused."""
    config = ModelConfig.from_dict(RELEASED, {"eos_token_id": [248046, 248044]})
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.head_dim) == (
        248320,
        5120,
        17408,
        256,
    )
    assert (config.rope_theta, config.torch_dtype, config.tie_word_embeddings) == (1e7, torch.bfloat16, False)
    assert config.eos_token_ids == (248044, 248046)  # text_config's first, then generation_config's
    assert config.moe is None and config.num_kv_layers == 1  # the full-attention layer's KV cache alone
    hybrid = config.hybrid
    assert hybrid is not None and hybrid.layer_types == (L, L, L, F)
    assert (hybrid.partial_rotary_factor, hybrid.rotary_dim, hybrid.attn_output_gate) == (0.25, 64, True)
    assert (hybrid.key_dim, hybrid.value_dim, hybrid.conv_dim) == (2048, 6144, 10240)  # 16*128, 48*128, 2k+v
    assert hybrid.linear_layers == (0, 1, 2) and hybrid.full_layers == (3,)
    assert [hybrid.is_linear(i) for i in range(4)] == [True, True, True, False]


def test_text_only_config_reads_the_same() -> None:
    """A qwen3_5_text config.json (ForCausalLM) gives the model its conditional form gives."""
    assert ModelConfig.from_dict(TEXT) == ModelConfig.from_dict(RELEASED)


def test_moe_router_always_renormalises() -> None:
    """qwen3_5_moe: every layer sparse with a shared expert, top-k renormalised (transformers' router always
    does); no intermediate_size, so the shared expert's width stands in."""
    for config in ({**RELEASED, "model_type": "qwen3_5_moe", "text_config": MOE_TEXT}, MOE_TEXT):
        model = ModelConfig.from_dict(config)
        moe = model.moe
        assert moe is not None and model.hybrid is not None
        assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (256, 8, 512)
        assert (moe.norm_topk_prob, moe.shared_expert_intermediate_size, moe.mlp_only_layers) == (
            True,
            512,
            (),
        )
        assert all(moe.is_sparse(i) for i in range(4))
        assert model.intermediate_size == 512
    assert ModelConfig.from_dict({**MOE_TEXT, "intermediate_size": 96}).intermediate_size == 96
    unshared = {**MOE_TEXT, "shared_expert_intermediate_size": 0, "moe_intermediate_size": 256}
    assert ModelConfig.from_dict(unshared).intermediate_size == 256  # no shared expert: the experts' width
    qwen3 = ModelConfig.from_dict({**TEXT, "model_type": "qwen3"})
    assert (
        qwen3.hybrid is None and qwen3.num_kv_layers == 4
    )  # Qwen3 is not hybrid: every layer has a KV cache


@pytest.mark.parametrize(
    ("num_layers", "interval", "expected"),
    [
        (8, None, [L, L, L, F, L, L, L, F]),  # transformers' default interval is 4
        (7, 3, [L, L, F, L, L, F, L]),
        (2, 1, [F, F]),
    ],
)
def test_layer_types_derived_from_full_attention_interval(
    num_layers: int, interval: int | None, expected: list[str]
) -> None:
    """Without layer_types, every interval-th layer is full attention, as Qwen3_5TextConfig derives them."""
    text = {k: v for k, v in TEXT.items() if k not in ("layer_types", "full_attention_interval")}
    text["num_hidden_layers"] = num_layers
    if interval is not None:
        text["full_attention_interval"] = interval
    hybrid = ModelConfig.from_dict(text).hybrid
    assert hybrid is not None and hybrid.layer_types == tuple(expected)


def test_absent_keys_take_transformers_defaults() -> None:
    """Absent linear widths, head_dim, partial_rotary_factor and attn_output_gate take Qwen3_5TextConfig's."""
    absent = ("head_dim", "attn_output_gate", "rope_parameters") + tuple(
        k for k in TEXT if k.startswith("linear")
    )
    text = {k: v for k, v in TEXT.items() if k not in absent} | {"rope_theta": 1e7}
    config = ModelConfig.from_dict(text)
    hybrid = config.hybrid
    assert hybrid is not None and config.head_dim == 256  # not hidden_size // heads
    assert (hybrid.linear_num_key_heads, hybrid.linear_num_value_heads) == (16, 32)
    assert (hybrid.linear_key_head_dim, hybrid.linear_value_head_dim, hybrid.linear_conv_kernel_dim) == (
        128,
        128,
        4,
    )
    assert (hybrid.partial_rotary_factor, hybrid.rotary_dim, hybrid.attn_output_gate) == (0.25, 64, True)
    beside = ModelConfig.from_dict(text | {"partial_rotary_factor": 0.5}).hybrid  # the older place for it
    assert beside is not None and beside.rotary_dim == 128


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layer_types": [L, L, F]}, "layer_types names 3 layers, num_hidden_layers is 4"),
        ({"layer_types": [L, L, L, "sliding_attention"]}, "layer_types holds \\['sliding_attention'\\]"),
        ({"layer_types": None, "full_attention_interval": 0}, "full_attention_interval must be >= 1"),
        ({"linear_num_value_heads": 24, "linear_num_key_heads": 16}, "must be a multiple of linear_num_key"),
        ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim must be >= 1"),
        ({"rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 1.5}}, "must be in \\(0, 1\\]"),
        ({"head_dim": 10, "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.3}}, "got 3"),
        ({"rope_parameters": {"rope_theta": 1e7, "rope_type": "yarn"}}, "RoPE scaling type 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ],
)
def test_bad_values_are_refused(change: dict[str, Any], message: str) -> None:
    """A config transformers would refuse, or the engine cannot serve, is an error saying which key."""
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**TEXT, **change})


def test_bad_conditional_configs_are_refused() -> None:
    """No text_config, tie flags that disagree, or norm_topk_prob false (transformers ignores it) are errors."""
    with pytest.raises(ValueError, match="must hold a text_config object"):
        ModelConfig.from_dict({"model_type": "qwen3_5"})
    with pytest.raises(ValueError, match="tie_word_embeddings differs"):
        ModelConfig.from_dict({**RELEASED, "tie_word_embeddings": True})
    with pytest.raises(ValueError, match="norm_topk_prob is false"):
        ModelConfig.from_dict({**MOE_TEXT, "norm_topk_prob": False})
    untied_text = {k: v for k, v in TEXT.items() if k != "tie_word_embeddings"}
    tied = ModelConfig.from_dict({**RELEASED, "tie_word_embeddings": True, "text_config": untied_text})
    assert tied.tie_word_embeddings  # the top level's flag alone, where transformers reads it


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("model.language_model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.A_log"),
        ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("lm_head.weight", "lm_head.weight"),
        ("model.layers.3.self_attn.q_norm.weight", "model.layers.3.self_attn.q_norm.weight"),  # text-only
        ("model.visual.blocks.0.attn.qkv.weight", None),
        ("mtp.layers.0.mlp.experts.7.down_proj.weight", None),
        ("mtp.fc.weight", None),
    ],
)
def test_text_weight_name(name: str, expected: str | None) -> None:
    """Released names lose model.language_model.'s `language_model.`; the vision tower and MTP head are skipped."""
    assert text_weight_name(name) == expected


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_both_layouts_hold_the_same_text_weights(tmp_path: Path, moe: bool) -> None:
    """The conditional checkpoint is the causal_lm one's text weights plus model.visual.* and mtp.*; both read
    as one ModelConfig; no norm weight, A_log or dt_bias keeps a neutral value."""
    conditional = make_tiny_qwen3_5_checkpoint(tmp_path / "conditional", moe=moe)
    causal_lm = make_tiny_qwen3_5_checkpoint(tmp_path / "causal_lm", moe=moe, layout="causal_lm")
    released, text = _tensors(conditional), _tensors(causal_lm)
    mapped = {text_weight_name(name): tensor for name, tensor in released.items()}
    mapped.pop(None)
    assert mapped.keys() == text.keys() and all(torch.equal(mapped[n], text[n]) for n in text)
    mtp = {name for name in released if name.startswith("mtp.")}
    shapes = mtp_shapes(load_hf_text_model(causal_lm).config)
    assert mtp == shapes.keys() and all(released[n].shape == shapes[n] for n in mtp)
    assert len(mtp) == (4 + 8 + 3 * 9 + 2 if moe else 15)  # fc, 3 norms; attention + 2 norms; the MLPs
    assert any(name.startswith("model.visual.") for name in released)
    assert ModelConfig.from_folder(conditional) == ModelConfig.from_folder(causal_lm)
    for name, tensor in text.items():
        if name.endswith("linear_attn.norm.weight"):  # x * w: neutral at 1
            assert (tensor != 1).all(), name
        elif name.endswith(("norm.weight", "A_log", "dt_bias")):  # zero-centred x * (1 + w): neutral at 0
            assert (tensor != 0).all(), name


def test_shards_and_dtype(tmp_path: Path) -> None:
    """num_shards and dtype apply to the mtp.* tensors too; the text weights are the float32 ones rounded."""
    folder = make_tiny_qwen3_5_checkpoint(tmp_path / "bf16", dtype=torch.bfloat16, num_shards=2)
    assert not (folder / "model.safetensors").exists()
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("model-*.safetensors")):
        tensors |= load_file(shard)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    reference = _tensors(make_tiny_qwen3_5_checkpoint(tmp_path / "f32"))
    assert tensors.keys() == reference.keys()
    assert all(torch.equal(tensors[n], reference[n].to(torch.bfloat16)) for n in reference)
    assert ModelConfig.from_folder(folder).torch_dtype == torch.bfloat16


def test_transformers_runs_its_torch_paths() -> None:
    """No flash-linear-attention, causal-conv1d or hub kernels: the reference is transformers' torch code."""
    from transformers.utils.import_utils import (
        is_causal_conv1d_available,
        is_flash_linear_attention_available,
        is_kernels_available,
    )

    assert not (
        is_flash_linear_attention_available() or is_causal_conv1d_available() or is_kernels_available()
    )


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_incremental_decoding_matches_the_full_sequence(tmp_path: Path, moe: bool) -> None:
    """transformers on the tiny model: a 5-token prefill, a 3-token chunk, then 1-token steps (recurrent Gated
    DeltaNet, conv state update, KV cache) give the full sequence's logits."""
    model = load_hf_text_model(make_tiny_qwen3_5_checkpoint(tmp_path / "model", moe=moe))
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits[0]  # (12, vocab)
        out = model(ids[:, :5], use_cache=True)
        pieces = [out.logits[0]]
        for start, end in [(5, 8), *((i, i + 1) for i in range(8, 12))]:
            out = model(ids[:, start:end], cache=out.cache, use_cache=True)
            pieces.append(out.logits[0])
    # transformers runs its Gated DeltaNet in float32 whatever the model's dtype, chunked for the prefill and
    # recurrent for the steps: the two forms round differently, and random routers and experts amplify that
    # (5e-4 in one MoE logit on an AMD EPYC, under 1e-4 on the Intel CPUs CI ran on). 1e-3 is the logit
    # tolerance docs/design.md gives a float near-tie; a wrong cache or state moves logits by far more.
    torch.testing.assert_close(torch.cat(pieces), full, atol=1e-3, rtol=0)
    assert full.std() > 1  # init_std 0.2 makes logits that vary, so the comparison means something


def test_a_zlab_dflash_drafter_for_a_32_layer_qwen3_5() -> None:
    """z-lab's Qwen3.5 DFlash layout (a dense Qwen3 drafter, block_size 16, mask_token_id 248070,
    target_layer_ids [1, 8, 15, 22, 29] for the 32-layer sizes) read from its config and fitted to a 32-layer
    Qwen3.5 of its width: the layers it names are DeltaNet (1, 8, 22, 29) and full-attention (15) ones; a
    target of another depth is refused."""
    text = {**TEXT, "num_hidden_layers": 32, "layer_types": None}  # interval 4: layers 3, 7, ... are full
    target = ModelConfig.from_dict({**RELEASED, "text_config": text})
    drafter = DFlashConfig.from_dict(
        {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 5120,
            "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 17408, "vocab_size": 248320, "max_position_embeddings": 262144,
            "rope_theta": 10000000, "block_size": 16, "num_target_layers": 32,
            "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 8, 15, 22, 29]},
        }
    )  # fmt: skip
    assert (drafter.block_size, drafter.mask_token_id, drafter.target_layer_ids) == (
        16,
        248070,
        (1, 8, 15, 22, 29),
    )
    check_fits_target(drafter, target)
    hybrid = target.hybrid
    assert hybrid is not None and [hybrid.is_linear(i) for i in drafter.target_layer_ids] == [
        True,
        True,
        False,
        True,
        True,
    ]
    with pytest.raises(ValueError, match="trained on a 32-layer target, this one has 4"):
        check_fits_target(drafter, ModelConfig.from_dict(RELEASED))
