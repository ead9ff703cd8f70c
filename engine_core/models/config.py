"""The facts about a Qwen3 or Qwen3.5 (dense or MoE) checkpoint that the engine needs, read from its Hugging Face
folder."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from openinfer.engine_core.models.config_sizes import SIZE_FIELDS
from openinfer.engine_core.models.hybrid_config import HybridConfig
from openinfer.engine_core.models.model_folder import model_file

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_QWEN3 = ("qwen3", "qwen3_moe")
_QWEN3_5_CONDITIONAL = ("qwen3_5", "qwen3_5_moe")  # vision-language configs: the text model is in text_config
_QWEN3_5_TEXT = ("qwen3_5_text", "qwen3_5_moe_text")
_QWEN3_5_MOE = ("qwen3_5_moe", "qwen3_5_moe_text")


@dataclass(frozen=True)
class MoeConfig:
    """The mixture-of-experts part of a Qwen3-MoE or Qwen3.5-MoE config.json (transformers' `Qwen3MoeConfig`,
    `Qwen3_5MoeTextConfig`)."""

    num_experts: int  # experts per sparse layer (`num_experts`, or transformers 5's `num_local_experts`)
    num_experts_per_tok: int  # top-k: experts each token is routed to
    moe_intermediate_size: int  # width of each expert's SwiGLU MLP
    norm_topk_prob: bool  # the top-k softmax probabilities are renormalised to sum to 1
    decoder_sparse_step: int  # layer i is sparse when (i + 1) % step == 0 (and not in mlp_only_layers)
    mlp_only_layers: tuple[int, ...]  # layers with a dense MLP of intermediate_size whatever the step
    shared_expert_intermediate_size: int = 0  # width of the shared expert every token also runs (0: none)

    def __post_init__(self) -> None:
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"model config: num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                f"1..num_experts ({self.num_experts})"
            )
        if self.moe_intermediate_size < 1 or self.decoder_sparse_step < 1:
            raise ValueError("model config: moe_intermediate_size and decoder_sparse_step must be >= 1")
        if self.shared_expert_intermediate_size < 0:
            raise ValueError("model config: shared_expert_intermediate_size must be >= 0")

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` (0-based) has experts, as transformers' Qwen3MoeDecoderLayer decides."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> MoeConfig:
        return cls(
            num_experts=int(config.get("num_experts", config.get("num_local_experts", 0))),
            num_experts_per_tok=_required(config, "num_experts_per_tok"),
            moe_intermediate_size=_required(config, "moe_intermediate_size"),
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            decoder_sparse_step=int(config.get("decoder_sparse_step", 1)),
            mlp_only_layers=tuple(int(i) for i in config.get("mlp_only_layers") or ()),
        )

    @classmethod
    def from_qwen3_5_dict(cls, text_config: dict[str, Any]) -> MoeConfig:
        """Read a Qwen3.5-MoE text config. Its layers are all sparse, each with one shared expert gated by
        sigmoid(shared_expert_gate(x)), and transformers' Qwen3_5MoeTopKRouter always renormalises the top-k
        softmax probabilities (the config has no norm_topk_prob; one saying false is refused, being ambiguous)."""
        if text_config.get("norm_topk_prob", True) is not True:
            raise ValueError(
                "model config: norm_topk_prob is false, but transformers' Qwen3.5-MoE router always "
                "renormalises the top-k weights; remove the key to serve the model as transformers runs it"
            )
        return cls(
            num_experts=_required(text_config, "num_experts"),
            num_experts_per_tok=_required(text_config, "num_experts_per_tok"),
            moe_intermediate_size=_required(text_config, "moe_intermediate_size"),
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=(),
            shared_expert_intermediate_size=_required(text_config, "shared_expert_intermediate_size"),
        )


@dataclass(frozen=True)
class ModelConfig:
    """A Qwen3 or Qwen3.5 model's architecture, from `config.json` (+ `generation_config.json` if present).
    For a Qwen3.5 vision-language config (model_type qwen3_5 / qwen3_5_moe) it is the text model's, from
    `text_config`; the vision tower is not served."""

    vocab_size: int  # rows of the embedding and of the LM head
    hidden_size: int  # width of the residual stream
    # width of the SwiGLU MLP (of a MoE model's dense layers); a Qwen3.5-MoE config may have none (no layer is
    # dense): then the shared expert's width, or the experts' if it has no shared expert
    intermediate_size: int
    num_hidden_layers: int  # decoder layers
    num_attention_heads: int  # query heads
    num_key_value_heads: int  # key/value heads (GQA: divides num_attention_heads)
    head_dim: int  # per-head width (Qwen3 sets it explicitly; hidden_size // heads otherwise)
    rms_norm_eps: float  # epsilon of every RMSNorm
    rope_theta: float  # RoPE base (plain RoPE only: scaled variants are refused)
    max_position_embeddings: int  # longest sequence the model was built for
    tie_word_embeddings: bool  # the LM head reuses the embedding matrix
    attention_bias: bool  # q/k/v/o projections carry biases
    eos_token_ids: tuple[int, ...]  # end-of-sequence ids, config.json's first, then generation_config.json's
    torch_dtype: torch.dtype | None  # dtype the weights were saved in, None when the config does not say
    moe: MoeConfig | None = None  # the experts of a Qwen3-MoE or Qwen3.5-MoE model; None: dense
    hybrid: HybridConfig | None = None  # Qwen3.5's linear-attention layers and partial RoPE; None: Qwen3

    def __post_init__(self) -> None:
        for name in SIZE_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model config: {name} must be an integer >= 1, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"model config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        for name, number in (("rope_theta", self.rope_theta), ("rms_norm_eps", self.rms_norm_eps)):
            if not (math.isfinite(number) and number > 0):  # NaN passes `<= 0`
                raise ValueError(f"model config: {name} must be a finite number > 0, got {number}")
        outside = [token_id for token_id in self.eos_token_ids if not 0 <= token_id < self.vocab_size]
        if outside:
            raise ValueError(
                f"model config: eos_token_id {outside} outside the vocabulary (0..{self.vocab_size - 1})"
            )
        if self.hybrid is not None:
            if len(self.hybrid.layer_types) != self.num_hidden_layers:
                raise ValueError(
                    f"model config: layer_types names {len(self.hybrid.layer_types)} layers, "
                    f"num_hidden_layers is {self.num_hidden_layers}"
                )
            if self.hybrid.rotary_dim > self.head_dim:
                raise ValueError(
                    f"model config: rotary_dim ({self.hybrid.rotary_dim}) exceeds head_dim ({self.head_dim})"
                )

    @property
    def q_width(self) -> int:
        """Width of the queries: all query heads (Qwen3.5's q_proj outputs twice this, query and gate per head)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the key (and of the value) projection's output."""
        return self.num_key_value_heads * self.head_dim

    @property
    def num_kv_layers(self) -> int:
        """Decoder layers with a KV cache: a hybrid model's full-attention layers, else every layer."""
        return self.num_hidden_layers if self.hybrid is None else len(self.hybrid.full_layers)

    @property
    def attention_scale(self) -> float:
        """The softmax scale, 1 / sqrt(head_dim)."""
        return self.head_dim**-0.5

    @classmethod
    def from_folder(cls, folder: Path | str) -> ModelConfig:
        """Read `folder/config.json` and, when present, `folder/generation_config.json`."""
        folder = Path(folder)
        config_path = folder / "config.json"
        if not os.path.lexists(config_path):
            raise FileNotFoundError(
                f"{config_path} not found: --model must be a Hugging Face model folder holding config.json"
            )
        config = _read_json(model_file(folder, "config.json"))
        has_generation = os.path.lexists(folder / "generation_config.json")
        generation = _read_json(model_file(folder, "generation_config.json")) if has_generation else {}
        try:
            return cls.from_dict(config, generation)
        except (ValueError, TypeError) as e:  # TypeError: a value of the wrong JSON type
            raise ValueError(f"{config_path}: {e}") from e

    @classmethod
    def from_dict(
        cls, config: dict[str, Any], generation_config: dict[str, Any] | None = None
    ) -> ModelConfig:
        """Build from the parsed JSON of config.json (and generation_config.json)."""
        model_type = config.get("model_type")
        if model_type not in (*_QWEN3, *_QWEN3_5_CONDITIONAL, *_QWEN3_5_TEXT):
            raise ValueError(
                f"model_type is {model_type!r}; only 'qwen3' (dense Qwen3), 'qwen3_moe' (Qwen3-MoE), 'qwen3_5' or "
                "'qwen3_5_text' (Qwen3.5) and 'qwen3_5_moe' or 'qwen3_5_moe_text' (Qwen3.5-MoE) models are "
                "supported"
            )
        text = _text_config(config) if model_type in _QWEN3_5_CONDITIONAL else config
        if text.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {text['hidden_act']!r} is not supported; Qwen3 uses 'silu'")
        if text.get("use_sliding_window", False):
            raise ValueError("sliding-window attention is not supported; set use_sliding_window to false")
        hidden_size = _required(text, "hidden_size")
        num_heads = _required(text, "num_attention_heads")
        num_layers = _required(text, "num_hidden_layers")
        is_qwen3_5 = model_type not in _QWEN3
        # transformers' default; a head count < 1 is refused by __post_init__, not divided by
        head_dim = text.get("head_dim") or (256 if is_qwen3_5 else hidden_size // max(num_heads, 1))
        moe = None
        if model_type == "qwen3_moe":
            moe = MoeConfig.from_dict(text)
        elif model_type in _QWEN3_5_MOE:
            moe = MoeConfig.from_qwen3_5_dict(text)
        dtype_name = config.get(
            "dtype", config.get("torch_dtype", text.get("dtype", text.get("torch_dtype")))
        )
        return cls(
            vocab_size=_required(text, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_intermediate_size(text, moe if model_type in _QWEN3_5_MOE else None),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=text.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(text),
            max_position_embeddings=_required(text, "max_position_embeddings"),
            tie_word_embeddings=_tie_word_embeddings(config, text),
            attention_bias=bool(text.get("attention_bias", False)),
            eos_token_ids=_eos_token_ids([config, text, generation_config or {}]),
            torch_dtype=_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None,
            moe=moe,
            hybrid=HybridConfig.from_dict(text, num_layers, head_dim) if is_qwen3_5 else None,
        )


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's part of a vision-language config (its vision_config is not read)."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"a {config['model_type']!r} config.json must hold a text_config object")
    return text


def _intermediate_size(text: dict[str, Any], qwen3_5_moe: MoeConfig | None) -> Any:
    """The dense MLP's width; a Qwen3.5-MoE config may have none (no dense layer reads it)."""
    if qwen3_5_moe is None:
        return _required(text, "intermediate_size")
    return text.get("intermediate_size") or (
        qwen3_5_moe.shared_expert_intermediate_size or qwen3_5_moe.moe_intermediate_size
    )


def _tie_word_embeddings(config: dict[str, Any], text: dict[str, Any]) -> bool:
    """transformers ties a conditional-generation model's head by the top-level flag and vLLM by text_config's:
    either is read when the other is absent, and a disagreement is refused."""
    flags = {
        bool(source["tie_word_embeddings"]) for source in (config, text) if "tie_word_embeddings" in source
    }
    if len(flags) > 1:
        raise ValueError(
            "model config: tie_word_embeddings differs between the top level and text_config; make them equal"
        )
    return flags.pop() if flags else False


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e}") from e
    except ValueError as e:  # not JSON, or not UTF-8
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def _required(config: dict[str, Any], key: str) -> int:
    """An integer the config must hold (every required key is a size or a count)."""
    if key not in config:
        raise ValueError(f"config.json has no {key!r}")
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"model config: {key} must be an integer, got {value!r}")
    return value


def _rope_theta(config: dict[str, Any]) -> float:
    """RoPE base from transformers 5's `rope_parameters` or 4's `rope_theta` (+ `rope_scaling`)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for source in (params, scaling):
        rope_type = source.get("rope_type", source.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"RoPE scaling type {rope_type!r} is not supported (only plain RoPE); remove it from "
                "config.json to serve the model at its native context length"
            )
    theta = params.get("rope_theta", config.get("rope_theta"))
    if theta is None:
        raise ValueError("config.json has neither rope_parameters.rope_theta nor rope_theta")
    return float(theta)


def _eos_token_ids(sources: list[dict[str, Any]]) -> tuple[int, ...]:
    """The eos_token_id values of config.json (top level, then text_config) and generation_config.json."""
    ids: list[int] = []
    for value in (source.get("eos_token_id") for source in sources):
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is not None and token_id not in ids:
                ids.append(int(token_id))
    return tuple(ids)
