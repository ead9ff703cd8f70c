"""The hybrid half of a Qwen3.5 config (transformers' `Qwen3_5TextConfig`): which layers are Gated DeltaNet
(linear attention) and which gated full attention, and the linear layers' widths; plus the map from a released
Qwen3.5 checkpoint's tensor names to the text model's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class HybridConfig:
    """The layer mix and linear-attention widths of a Qwen3.5 (dense or MoE) text model."""

    layer_types: tuple[str, ...]  # per decoder layer: "linear_attention" (Gated DeltaNet) or "full_attention"
    linear_num_key_heads: int  # query/key heads of a linear layer
    linear_num_value_heads: int  # value heads: each key head serves num_value // num_key consecutive ones
    linear_key_head_dim: int  # per-head width of a linear layer's queries and keys
    linear_value_head_dim: int  # per-head width of its values (and of its gated RMSNorm)
    linear_conv_kernel_dim: int  # taps of the causal depthwise conv over the concatenated q, k, v
    partial_rotary_factor: float  # share of a full-attention head's dims that RoPE rotates (the first ones)
    rotary_dim: int  # int(head_dim * partial_rotary_factor), as transformers rounds it: the rotated dims
    attn_output_gate: (
        bool  # full attention's output is scaled by sigmoid(gate), q_proj's second half per head
    )

    def __post_init__(self) -> None:
        unknown = sorted(set(self.layer_types) - {LINEAR_ATTENTION, FULL_ATTENTION})
        if unknown:
            raise ValueError(
                f"model config: layer_types holds {unknown}; each must be {LINEAR_ATTENTION!r} or "
                f"{FULL_ATTENTION!r}"
            )
        for name in (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"model config: {name} must be >= 1, got {getattr(self, name)}")
        if self.linear_num_value_heads % self.linear_num_key_heads != 0:
            raise ValueError(
                f"model config: linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(
                f"model config: partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}"
            )
        if self.rotary_dim < 2 or self.rotary_dim % 2 != 0:
            raise ValueError(
                f"model config: head_dim * partial_rotary_factor must give an even number of rotated dims "
                f">= 2, got {self.rotary_dim}"
            )

    @property
    def key_dim(self) -> int:
        """Width of a linear layer's queries (and of its keys): all key heads."""
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        """Width of a linear layer's values, of its output gate z and of out_proj's input."""
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv (= in_proj_qkv's output): q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    def is_linear(self, layer: int) -> bool:
        """Whether decoder layer `layer` (0-based) is a Gated DeltaNet layer (else full attention)."""
        return self.layer_types[layer] == LINEAR_ATTENTION

    @property
    def linear_layers(self) -> tuple[int, ...]:
        """The Gated DeltaNet layers, ascending."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == LINEAR_ATTENTION)

    @property
    def full_layers(self) -> tuple[int, ...]:
        """The full-attention layers (the only ones with a KV cache), ascending."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == FULL_ATTENTION)

    @classmethod
    def from_dict(cls, text_config: dict[str, Any], num_hidden_layers: int, head_dim: int) -> HybridConfig:
        """Read a Qwen3.5 text config (the `text_config` of a conditional-generation config.json) with
        transformers' defaults for absent keys. That it names `num_hidden_layers` layers is
        :class:`ModelConfig`'s check."""
        layer_types = text_config.get("layer_types")
        if layer_types is None:  # as Qwen3_5TextConfig derives them: every interval-th layer is full
            interval = int(text_config.get("full_attention_interval", 4))
            if interval < 1:
                raise ValueError(f"model config: full_attention_interval must be >= 1, got {interval}")
            layer_types = [
                LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(num_hidden_layers)
            ]
        factor = float(_partial_rotary_factor(text_config))
        return cls(
            layer_types=tuple(str(kind) for kind in layer_types),
            linear_num_key_heads=int(text_config.get("linear_num_key_heads", 16)),
            linear_num_value_heads=int(text_config.get("linear_num_value_heads", 32)),
            linear_key_head_dim=int(text_config.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(text_config.get("linear_value_head_dim", 128)),
            linear_conv_kernel_dim=int(text_config.get("linear_conv_kernel_dim", 4)),
            partial_rotary_factor=factor,
            rotary_dim=int(head_dim * factor),
            attn_output_gate=bool(text_config.get("attn_output_gate", True)),
        )


def _partial_rotary_factor(text_config: dict[str, Any]) -> Any:
    """transformers 5 keeps it in rope_parameters; older configs beside them; Qwen3_5TextConfig's default 0.25."""
    params = text_config.get("rope_parameters") or {}
    return params.get("partial_rotary_factor", text_config.get("partial_rotary_factor", 0.25))


_TEXT_PREFIX = "model.language_model."
_SKIPPED_PREFIXES = ("model.visual.", "mtp.")  # the vision tower; the multi-token-prediction head


def text_weight_name(name: str) -> str | None:
    """The text model's name (`model.layers.0...`, `lm_head.weight`) for a tensor of a Qwen3.5 checkpoint, or
    None for one it does not use. A released (vision-language) checkpoint holds the text model under
    `model.language_model.`, beside `model.visual.*` and `mtp.*`; a text-only one holds it under `model.`
    already. Any other name comes back unchanged, for the loader to accept or refuse."""
    if name.startswith(_TEXT_PREFIX):
        return "model." + name[len(_TEXT_PREFIX) :]
    if name.startswith(_SKIPPED_PREFIXES):
        return None
    return name
