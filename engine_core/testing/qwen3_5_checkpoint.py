"""Tiny random Qwen3.5 checkpoints (Gated DeltaNet + gated full-attention layers, dense or MoE) in Hugging Face
format, in the released vision-language layout or as a text-only ForCausalLM (test fixtures), and the
transformers text model that reads them (the parity tests' reference)."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file

from openinfer.engine_core.models.hybrid_config import text_weight_name
from openinfer.engine_core.testing.tiny_model import finish_checkpoint, unfilled_model

# transformers' Qwen3_5TextConfig arguments of a small hybrid model over the built-in tokenizer's vocabulary
# (512): 3 Gated DeltaNet layers then 1 full-attention layer (full_attention_interval 4), 2 query heads over 1
# KV head, 2 linear key heads over 4 value heads (read-only). RoPE rotates half of each head (8 of 16 dims; the
# releases rotate a quarter of 256), with the releases' interleaved multimodal sections sized to match.
SMALL_QWEN3_5: MappingProxyType[str, Any] = MappingProxyType(
    {
        "vocab_size": 512,  # the built-in tokenizer's vocabulary, specials included
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "intermediate_size": 128,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,  # as the larger releases: lm_head.weight is a tensor of its own
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],  # sums to rotary_dim / 2; text positions make the sections agree
            "mrope_interleaved": True,
        },
        "eos_token_id": 0,  # <|endoftext|>
        "bos_token_id": None,
        "pad_token_id": 0,
    }
)
# Qwen3_5MoeTextConfig's: SMALL_QWEN3_5's attention, every layer's MLP 8 experts of width 32 (top-2) plus a
# shared expert of width 32; no intermediate_size (no layer is dense), as transformers defines the config.
SMALL_QWEN3_5_MOE: MappingProxyType[str, Any] = MappingProxyType(
    {
        **{key: value for key, value in SMALL_QWEN3_5.items() if key != "intermediate_size"},
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    }
)
# Qwen3_5VisionConfig's smallest vision tower: 1 block of width 16, 2x2 patches of single frames, a 4x4
# position grid; out_hidden_size is set to the text model's hidden_size.
TINY_QWEN3_5_VISION: MappingProxyType[str, Any] = MappingProxyType(
    {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "patch_size": 2,
        "spatial_merge_size": 1,
        "temporal_patch_size": 1,
        "num_position_embeddings": 16,
    }
)
Layout = Literal["conditional", "causal_lm"]
_MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")


def make_tiny_qwen3_5_checkpoint(
    folder: Path | str,
    *,
    seed: int = 0,
    init_std: float = 0.2,
    overrides: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    moe: bool = False,
    layout: Layout = "conditional",
    num_shards: int = 1,
    mtp: bool = True,
) -> Path:
    """Write a random Qwen3.5 checkpoint of SMALL_QWEN3_5 (SMALL_QWEN3_5_MOE with `moe`) + `overrides` (text
    config keys) into `folder`: config.json, generation_config.json, the weights in `dtype` and the built-in
    tokenizer files when the package has them.

    `layout` "conditional" is the released one: a Qwen3_5(Moe)ForConditionalGeneration (text model under
    `model.language_model.`, a TINY_QWEN3_5_VISION tower under `model.visual.`, `lm_head.weight`), experts per
    expert as save_pretrained writes them, plus with `mtp` a random multi-token-prediction head under `mtp.`
    (see mtp_shapes; config.json's text_config then says mtp_num_hidden_layers 1). "causal_lm" is a
    Qwen3_5(Moe)ForCausalLM saved as is (`model.*`, `lm_head.weight`; `mtp` does not apply).

    The same arguments give the same text weights whichever the layout (see random_text_model); the vision
    tower and the MTP head are drawn after them from generators of their own. `num_shards` > 1 splits the
    weights into that many files with a `model.safetensors.index.json`."""
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5MoeConfig,
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeForConditionalGeneration,
        Qwen3_5MoeTextConfig,
        Qwen3_5TextConfig,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    base = SMALL_QWEN3_5_MOE if moe else SMALL_QWEN3_5
    # a deep copy: transformers may edit the nested rope_parameters and layer_types in place
    kwargs = copy.deepcopy({**base, "initializer_range": init_std, **(overrides or {})})
    text_config = (Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig)(**kwargs)
    text_model = random_text_model(
        Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM, text_config, seed, init_std
    )
    if layout == "causal_lm":
        text_model.to(dtype).save_pretrained(folder)
    elif layout == "conditional":
        text = text_config.to_dict()
        if mtp:  # the releases' keys: one MTP layer, sharing the model's embedding
            text |= {"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False}
        config = (Qwen3_5MoeConfig if moe else Qwen3_5Config)(
            text_config=text,
            vision_config={**TINY_QWEN3_5_VISION, "out_hidden_size": text_config.hidden_size},
            tie_word_embeddings=text_config.tie_word_embeddings,  # where transformers reads it
        )
        model_class = Qwen3_5MoeForConditionalGeneration if moe else Qwen3_5ForConditionalGeneration
        model = _with_text_weights(model_class, config, text_model, seed, init_std)
        model.to(dtype).save_pretrained(folder)
        if mtp:
            tensors = load_file(folder / "model.safetensors")
            generator = torch.Generator().manual_seed(seed + 2)
            for name, shape in mtp_shapes(text_config).items():
                tensors[name] = (torch.randn(shape, generator=generator) * init_std).to(dtype)
            save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    else:
        raise ValueError(f"layout must be 'conditional' or 'causal_lm', got {layout!r}")
    return finish_checkpoint(folder, num_shards)


def random_text_model(model_class: Any, config: Any, seed: int, init_std: float) -> Any:
    """A float32 Qwen3_5(Moe)ForCausalLM whose every parameter is drawn from N(0, init_std), in parameter order,
    by a generator seeded with `seed`. No weight keeps a neutral value that would hide a mistake: the
    zero-centred RMSNorms (x * (1 + w): layer, final, q_norm, k_norm) get w ~ N(0, init_std), the Gated
    DeltaNet's gated norm (x * w, not zero-centred) w ~ 1 + N(0, init_std), and A_log, dt_bias and the conv
    weights are random too. Built on the meta device, so transformers' own init is skipped."""
    model = unfilled_model(model_class, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights are listed once
            param.normal_(0.0, init_std, generator=generator)
            if name.endswith("linear_attn.norm.weight"):
                param.add_(1.0)
    return model


def _with_text_weights(model_class: Any, config: Any, text_model: Any, seed: int, init_std: float) -> Any:
    """A float32 conditional-generation model holding `text_model`'s weights, its vision tower drawn from
    N(0, init_std) by a generator seeded with seed + 1."""
    with torch.device("meta"):
        model = model_class(config)
    model.to_empty(device="cpu")
    model.tie_weights()
    text_weights = dict(text_model.named_parameters())
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            text_name = text_weight_name(name)
            if text_name is None:  # model.visual.*
                param.normal_(0.0, init_std, generator=generator)
            else:
                param.copy_(text_weights[text_name])
    return model


def mtp_shapes(text_config: Any) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a released Qwen3.5 checkpoint's multi-token-prediction head, as vLLM's
    Qwen3_5MultiTokenPredictor loads it: fc maps [norm(embedding); norm(hidden)] (2 * hidden) to hidden, then
    one full-attention decoder layer (gated q_proj) with the model's MLP (experts per expert, a shared expert),
    then a final norm. The head shares the model's embedding and lm_head."""
    c = text_config
    hidden, head_dim = c.hidden_size, c.head_dim
    layer = "mtp.layers.0."
    shapes: dict[str, tuple[int, ...]] = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.norm.weight": (hidden,),
        layer + "input_layernorm.weight": (hidden,),
        layer + "post_attention_layernorm.weight": (hidden,),
        layer + "self_attn.q_proj.weight": (2 * c.num_attention_heads * head_dim, hidden),  # query and gate
        layer + "self_attn.k_proj.weight": (c.num_key_value_heads * head_dim, hidden),
        layer + "self_attn.v_proj.weight": (c.num_key_value_heads * head_dim, hidden),
        layer + "self_attn.o_proj.weight": (hidden, c.num_attention_heads * head_dim),
        layer + "self_attn.q_norm.weight": (head_dim,),
        layer + "self_attn.k_norm.weight": (head_dim,),
    }
    if c.model_type == "qwen3_5_moe_text":  # prefix -> width of each SwiGLU MLP
        mlps = {f"mlp.experts.{e}.": c.moe_intermediate_size for e in range(c.num_experts)}
        mlps["mlp.shared_expert."] = c.shared_expert_intermediate_size
        shapes[layer + "mlp.gate.weight"] = (c.num_experts, hidden)
        shapes[layer + "mlp.shared_expert_gate.weight"] = (1, hidden)
    else:
        mlps = {"mlp.": c.intermediate_size}
    for prefix, width in mlps.items():
        shapes[layer + prefix + "gate_proj.weight"] = (width, hidden)
        shapes[layer + prefix + "up_proj.weight"] = (width, hidden)
        shapes[layer + prefix + "down_proj.weight"] = (hidden, width)
    return shapes


def load_hf_text_model(folder: Path | str) -> Any:
    """transformers' Qwen3_5(Moe)ForCausalLM over the text weights of a Qwen3.5 checkpoint of either layout
    (the vision tower and `mtp.*` are left out), in float32 eval mode: the parity tests' reference. Without
    flash-linear-attention and causal-conv1d transformers runs its torch Gated DeltaNet and conv."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

    folder = Path(folder)
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    model_class: Any = Qwen3_5MoeForCausalLM if model_type in _MOE_TYPES else Qwen3_5ForCausalLM
    # a conditional config.json is read through its text_config (the class's base_config_key)
    model, info = model_class.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    if info["missing_keys"] or info["mismatched_keys"]:
        raise ValueError(
            f"{folder}: transformers found no weights for {sorted(info['missing_keys'])} and a wrong shape "
            f"for {info['mismatched_keys']}"
        )
    return model.eval()


# The token-repeating fixture: vocabulary size, and the factor on its tied embedding.
REPETITIVE_VOCAB = 64
REPETITIVE_EMBED_SCALE = 9.0


def make_repetitive_qwen3_5_checkpoint(
    folder: Path | str, *, seed: int = 3, moe: bool = False, layout: Layout = "causal_lm"
) -> Path:
    """A Qwen3.5 checkpoint (64-token vocabulary, tied embeddings) whose greedy output runs in repeats, so that
    prompt lookup's drafts are accepted at every length, and rejected too: the embedding is scaled by
    REPETITIVE_EMBED_SCALE, which makes the current token's own embedding the residual stream's largest part
    about as often as not (the LM head is that embedding: it then predicts the same token again); where it is
    not, the DeltaNet and attention layers choose the next token. Random weights alone almost never repeat,
    and a drafter's tokens are then rejected at their first position. `layout` is make_tiny_qwen3_5_checkpoint's
    (the text weights are the same in both)."""
    folder = make_tiny_qwen3_5_checkpoint(
        folder,
        seed=seed,
        moe=moe,
        layout=layout,
        overrides={"vocab_size": REPETITIVE_VOCAB, "tie_word_embeddings": True},
    )
    tensors = load_file(folder / "model.safetensors")
    tensors.pop("lm_head.weight", None)  # tied: the embedding is the head
    prefix = "model.language_model." if layout == "conditional" else "model."
    tensors[prefix + "embed_tokens.weight"] *= REPETITIVE_EMBED_SCALE
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def repetitive_prompts() -> list[list[int]]:
    """Eight prompts for the token-repeating checkpoint (ids 1..63 of its 64), of mixed lengths up to 60."""
    rng = random.Random(0)
    return [[rng.randrange(1, REPETITIVE_VOCAB) for _ in range(n)] for n in (3, 9, 17, 30, 12, 45, 6, 60)]
