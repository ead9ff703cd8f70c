"""DFlash block drafter in z-lab's checkpoint layout.

Learned from z-lab/dflash (`dflash/model.py`, `model/dflash.py`), cross-checked with vLLM
(`vllm/model_executor/models/qwen3_dflash.py`, `vllm/v1/spec_decode/dflash.py`,
`vllm/v1/worker/gpu/spec_decode/dflash/speculator.py`) and SGLang (`srt/speculative/dflash_utils.py`):

- config.json is a Qwen3 config (model_type "qwen3", architectures ["DFlashDraftModel"]) for the draft's own
  layers, whose hidden_size is the target's, plus `block_size` (top level in z-lab's published configs; newer
  code looks in `dflash_config` first, as here), `num_target_layers`, and `dflash_config` {`mask_token_id`,
  `target_layer_ids`}.
- Weights: `layers.{i}.self_attn.{q,k,v,o}_proj`, `.self_attn.{q,k}_norm`, `.mlp.{gate,up,down}_proj`,
  `.input_layernorm`, `.post_attention_layernorm`; `fc` (len(target_layer_ids) * hidden -> hidden, no bias),
  `hidden_norm`, `norm`. No embedding, no LM head: the target's embedding and head serve the block.
- `target_layer_ids` are 0-based decoder layers; a layer's feature is its output, transformers'
  `hidden_states[i + 1]` (z-lab's `extract_context_feature` adds 1; SGLang, which captures layer inputs,
  adds 1 too). That is `Qwen3ForCausalLM.forward_with_aux(aux_layer_ids=target_layer_ids)`, which gives
  the last layer's entry after the final norm, as transformers does.
- Context: the chosen layers' features are concatenated in `target_layer_ids` order, then
  f = hidden_norm(fc(x)). Every draft layer takes the same f (no input_layernorm on it): keys
  RoPE(k_norm(k_proj(f))) at the context token's own position, values v_proj(f). They come before the block's
  own keys/values; queries come only from the block. Attention is non-causal: each block token sees the
  whole context and the whole block.
- Block: z-lab's `dflash_generate` puts the current token (sampled, not yet verified, at position p) in slot 0
  and `mask_token_id` in slots 1..block_size-1, at positions p..p+block_size-1; the context is every verified
  position < p. Slot i >= 1 drafts position p+i, slot 0's output is unused, so K <= block_size - 1. z-lab's
  configs carry no key for this; vLLM and SGLang read `dflash_config.sample_from_anchor` (absent/false = this
  layout). True is DSpark's layout: slot 0 still holds the current token, but slot i drafts position p+i+1
  (K <= block_size); vLLM's DFlash path refuses it. See `AnchorLayout` for how the layout is decided here.
- Block length: z-lab's `dflash_generate(block_size=n)` verifies n tokens a round, the current one and
  n - 1 drafts, cut to the tokens left at the end of a request; K drafts are its n = K + 1
  (`DFlashDrafter.block_length`).
- Optional keys, read as z-lab reads them (`dflash_config` first): `input_embedding_scale` (block embeddings),
  `output_multiplier` and `final_logit_softcapping` (draft logits), `num_target_layers` (checked against
  the target; with no `target_layer_ids`, z-lab's default layers for it), `block_size` (16 when absent).
- Refused: causal or sliding-window draft layers, DFlash2's conv/selector extras.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.qwen3 import (
    Qwen3MLP,
    RMSNorm,
    RotaryEmbedding,
    apply_rope,
)
from openinfer.engine_core.models.weights import iter_safetensors
from openinfer.kernels.attention import write_kv_cache

_ZLAB_ARCHITECTURE = "DFlashDraftModel"
_UNSUPPORTED_EXTRAS = ("conv_kernel_size", "selector_rank", "projector_type")  # DFlash2 / Domino drafters
_ZLAB_BLOCK_SIZE = 16  # z-lab's DFlashDraftModel default when the config names no block_size


class AnchorLayout(enum.Enum):
    """Which slots of a draft block carry the drafts. In both, slot 0 holds the current token at its
    position p and slots 1.. hold mask tokens at p+1, ...

    Decided by `dflash_config.sample_from_anchor` when the config has it; else by an explicit choice (the
    engine's flag); else, for a config whose architectures name z-lab's `DFlashDraftModel`, by z-lab's
    reference code, which always uses MASK_SLOTS; anything else is an error."""

    MASK_SLOTS = "mask_slots"  # z-lab DFlash (sample_from_anchor false): slot i >= 1 drafts position p + i
    ANCHOR_SLOT = "anchor_slot"  # DSpark (sample_from_anchor true): slot i >= 0 drafts position p + i + 1

    @property
    def first_draft_slot(self) -> int:
        return 1 if self is AnchorLayout.MASK_SLOTS else 0

    def max_drafts(self, block_size: int) -> int:
        """The most draft tokens one block of `block_size` slots yields."""
        return block_size - self.first_draft_slot


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter's architecture and block layout, from its `config.json`."""

    layers: ModelConfig  # the draft layers' Qwen3 sizes; vocab_size is the (shared) target vocabulary
    block_size: int  # slots in one draft block, the current token's included (not the KV-cache page size)
    mask_token_id: int  # token id in every slot but the first
    target_layer_ids: tuple[int, ...]  # 0-based target decoder layers whose outputs feed fc, in fc's order
    target_hidden_size: int  # width of one target layer's output
    num_target_layers: int | None  # decoder layers of the target it was trained for, when the config says
    anchor: AnchorLayout  # which block slots carry the drafts
    input_embedding_scale: float  # multiplies the target's embeddings of the block tokens (1 in z-lab's)
    output_multiplier: float = 1.0  # multiplies the draft logits (z-lab's compute_logits; 1 when absent)
    final_logit_softcapping: float | None = None  # logits -> tanh(logits / c) * c when set and > 0

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.anchor.max_drafts(self.block_size) < 1:
            raise ValueError(
                f"dflash: block_size {self.block_size} leaves no slot to draft from ({self.anchor})"
            )
        if not self.target_layer_ids or min(self.target_layer_ids) < 0:
            raise ValueError(
                f"dflash: target_layer_ids must be non-empty and >= 0, got {self.target_layer_ids}"
            )
        if self.num_target_layers is not None and max(self.target_layer_ids) >= self.num_target_layers:
            raise ValueError(
                f"dflash: target_layer_ids {self.target_layer_ids} name a layer past num_target_layers "
                f"({self.num_target_layers})"
            )
        if self.final_logit_softcapping is not None and not self.final_logit_softcapping > 0:
            raise ValueError(
                f"dflash: final_logit_softcapping must be > 0 or absent, got {self.final_logit_softcapping}"
            )
        if not 0 <= self.mask_token_id < self.layers.vocab_size:
            raise ValueError(
                f"dflash: mask_token_id {self.mask_token_id} is outside the vocabulary [0, "
                f"{self.layers.vocab_size})"
            )

    @property
    def max_drafts(self) -> int:
        """The most draft tokens one block yields: the largest K this drafter can serve."""
        return self.anchor.max_drafts(self.block_size)

    @classmethod
    def from_folder(cls, folder: Path | str, anchor: AnchorLayout | None = None) -> DFlashConfig:
        """Read `folder/config.json`; `anchor`, when given, is the layout the engine was told to use."""
        config_path = Path(folder) / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(
                f"{config_path} not found: --draft-model must be a DFlash checkpoint folder with config.json"
            )
        try:
            config = json.loads(config_path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{config_path} is not valid JSON: {e}") from e
        try:
            return cls.from_dict(config, anchor)
        except ValueError as e:
            raise ValueError(f"{config_path}: {e}") from e

    @classmethod
    def from_dict(cls, config: dict[str, Any], anchor: AnchorLayout | None = None) -> DFlashConfig:
        """Build from the parsed config.json. Keys are looked up in `dflash_config` first, then at the top
        level, as z-lab's code does."""
        dflash = config.get("dflash_config") or {}
        if not isinstance(dflash, dict):
            raise ValueError("dflash_config must be a JSON object")

        def value(key: str) -> Any:
            return dflash.get(key, config.get(key))

        for key in _UNSUPPORTED_EXTRAS:
            if value(key):
                raise ValueError(f"{key!r} belongs to a DFlash2/Domino drafter, which is not supported")
        if config.get("is_causal") or dflash.get("causal"):
            raise ValueError("causal DFlash draft layers are not supported (the block must be non-causal)")
        if "sliding_attention" in (config.get("layer_types") or []):
            raise ValueError("sliding-window DFlash draft layers are not supported")
        if value("mask_token_id") is None:
            raise ValueError("the config has no 'mask_token_id' (in dflash_config or at the top level)")
        layers = ModelConfig.from_dict(config)
        num_target_layers = value("num_target_layers")
        layer_ids = value("target_layer_ids")
        if layer_ids is None:  # z-lab's default: spread over the target's layers
            if num_target_layers is None:
                raise ValueError("the config has neither 'target_layer_ids' nor 'num_target_layers'")
            layer_ids = list(zlab_target_layer_ids(int(num_target_layers), layers.num_hidden_layers))
        if not isinstance(layer_ids, list) or not all(isinstance(i, int) for i in layer_ids):
            raise ValueError(f"target_layer_ids must be a list of integers, got {layer_ids!r}")
        softcap = value("final_logit_softcapping")
        return cls(
            layers=layers,
            block_size=int(value("block_size") or _ZLAB_BLOCK_SIZE),
            mask_token_id=int(value("mask_token_id")),
            target_layer_ids=tuple(layer_ids),
            target_hidden_size=int(value("target_hidden_size") or layers.hidden_size),
            num_target_layers=None if num_target_layers is None else int(num_target_layers),
            anchor=_anchor_layout(config, value("sample_from_anchor"), anchor),
            input_embedding_scale=float(_number(value("input_embedding_scale"), 1.0)),
            output_multiplier=float(_number(value("output_multiplier"), 1.0)),
            # z-lab applies the soft-cap only when it is set and > 0
            final_logit_softcapping=float(softcap) if softcap is not None and float(softcap) > 0 else None,
        )

    def check_target(self, target: ModelConfig) -> None:
        """Refuse a target this drafter cannot serve, saying what does not fit."""
        problems = []
        if self.layers.hidden_size != target.hidden_size or self.target_hidden_size != target.hidden_size:
            problems.append(
                f"the draft's hidden_size {self.layers.hidden_size} (target_hidden_size "
                f"{self.target_hidden_size}) must equal the target's {target.hidden_size}: it shares the "
                "target's embedding and LM head"
            )
        if self.num_target_layers not in (None, target.num_hidden_layers):
            problems.append(
                f"it was trained on a {self.num_target_layers}-layer target, this one has "
                f"{target.num_hidden_layers}"
            )
        if max(self.target_layer_ids) >= target.num_hidden_layers:
            problems.append(
                f"target_layer_ids {self.target_layer_ids} name a layer the target lacks: it has "
                f"{target.num_hidden_layers} (ids 0..{target.num_hidden_layers - 1})"
            )
        if self.mask_token_id >= target.vocab_size:
            problems.append(f"mask_token_id {self.mask_token_id} is past the target's vocabulary")
        if problems:
            raise ValueError("this DFlash drafter does not fit the target model: " + "; ".join(problems))


def zlab_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's default target layers: the middle one for one draft layer, else evenly from layer 1 to n - 3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    span = end - start
    return tuple(round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


def _number(value: Any, default: float) -> Any:
    """A config number, `default` when the key is absent or null."""
    return default if value is None else value


def _anchor_layout(config: dict[str, Any], stated: Any, chosen: AnchorLayout | None) -> AnchorLayout:
    from_config = (
        None if stated is None else (AnchorLayout.ANCHOR_SLOT if stated else AnchorLayout.MASK_SLOTS)
    )
    if chosen is not None:
        if from_config not in (None, chosen):
            raise ValueError(
                f"the config's sample_from_anchor={stated} means {from_config.value}, but {chosen.value} was "
                "asked for; drop the explicit anchor layout"
            )
        return chosen
    if from_config is not None:
        return from_config
    if _ZLAB_ARCHITECTURE in (config.get("architectures") or []):
        return AnchorLayout.MASK_SLOTS  # z-lab's format: its reference code always drafts from mask slots
    raise ValueError(
        "the config does not say which block slots carry the drafts (no dflash_config.sample_from_anchor, "
        f"and architectures does not name {_ZLAB_ARCHITECTURE}); choose the anchor layout explicitly"
    )


@dataclass(frozen=True)
class BlockContext:
    """Where each draft block's context keys/values lie in the paged context cache, for one propose call.

    The cache has the target's layout, one tensor per draft layer: (2, num_pages, page_size, num_kv_heads,
    head_dim); position p of block b's request is at page block_tables[b, p // page_size], offset
    p % page_size.
    """

    block_tables: Tensor  # (B, max_pages) int64, rows padded with page 0
    key_mask: Tensor  # (B, max_context_len + block_size) bool: context keys < the request's length; the block
    max_context_len: int
    page_size: int

    def gather(self, cache: Tensor) -> tuple[Tensor, Tensor]:
        """The padded context keys and values, each (B, max_context_len, num_kv_heads, head_dim)."""
        num_pages = -(-self.max_context_len // self.page_size)
        tables = self.block_tables[:, :num_pages]  # (B, num_pages)
        keys = cache[0][tables].flatten(1, 2)[:, : self.max_context_len]
        values = cache[1][tables].flatten(1, 2)[:, : self.max_context_len]
        return keys, values


class DFlashAttention(nn.Module):
    """Qwen3 attention: queries from the block; keys/values from the context, then from the block."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        bias = config.attention_bias
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_width, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_width, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_width, bias=bias)
        self.o_proj = nn.Linear(q_width, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def context_kv(self, features: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """features (n, hidden), cos/sin (n, head_dim) at the context positions -> keys, values (n, kv_heads,
        head_dim), as the cache stores them (keys normed and rotated)."""
        n = features.shape[0]
        k = self.k_norm(self.k_proj(features).view(n, self.num_kv_heads, self.head_dim))
        return apply_rope(k, cos, sin), self.v_proj(features).view(n, self.num_kv_heads, self.head_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, context: BlockContext) -> Tensor:
        """x (B, T, hidden), cos/sin (B * T, head_dim) at the block positions -> (B, T, hidden)."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b * t, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(b * t, self.num_kv_heads, self.head_dim))
        q = apply_rope(q, cos, sin).view(b, t, self.num_heads, self.head_dim)
        k = apply_rope(k, cos, sin).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        context_k, context_v = context.gather(cache)  # (B, S, kv_heads, head_dim) each
        keys = torch.cat((context_k, k), dim=1)  # (B, S + T, kv_heads, head_dim)
        values = torch.cat((context_v, v), dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # (B, heads, T, head_dim)
            keys.transpose(1, 2),  # (B, kv_heads, S + T, head_dim)
            values.transpose(1, 2),
            attn_mask=context.key_mask[:, None, None, :],  # (B, 1, 1, S + T): no causal part
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # (B, heads, T, head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, context: BlockContext) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, context)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(nn.Module):
    """The draft layers, fc, hidden_norm and the final norm; parameter names equal z-lab's checkpoint names.

    `context_caches` holds one tensor per draft layer, (2, num_pages, page_size, num_kv_heads, head_dim),
    filled by `write_context` and read by `forward`.
    """

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        layers = config.layers
        self.layers = nn.ModuleList(DFlashDecoderLayer(layers) for _ in range(layers.num_hidden_layers))
        self.fc = nn.Linear(
            len(config.target_layer_ids) * config.target_hidden_size, layers.hidden_size, bias=False
        )
        self.hidden_norm = RMSNorm(layers.hidden_size, layers.rms_norm_eps)
        self.norm = RMSNorm(layers.hidden_size, layers.rms_norm_eps)
        self.rotary = RotaryEmbedding(layers.head_dim, layers.rope_theta)

    def write_context(
        self, aux_hidden: Tensor, positions: Tensor, slot_mapping: Tensor, context_caches: Sequence[Tensor]
    ) -> None:
        """aux_hidden (n, len(target_layer_ids) * target_hidden): the target's layer outputs at `positions`
        (n,); each draft layer's context key/value for them goes to `slot_mapping` (n,) of its cache."""
        features = self.hidden_norm(self.fc(aux_hidden))  # (n, hidden)
        cos, sin = self.rotary.cos_sin(positions, features.dtype)  # (n, head_dim) each
        layers = cast("Iterable[DFlashDecoderLayer]", self.layers)  # ModuleList iterates as plain Modules
        for layer, cache in zip(layers, context_caches, strict=True):
            k, v = layer.self_attn.context_kv(features, cos, sin)
            write_kv_cache(cache, k, v, slot_mapping)

    def forward(
        self, block_embeds: Tensor, positions: Tensor, context_caches: Sequence[Tensor], context: BlockContext
    ) -> Tensor:
        """block_embeds (B, block_size, hidden), positions (B * block_size,) -> final hidden (B, block_size,
        hidden), after the final norm, ready for the target's LM head."""
        cos, sin = self.rotary.cos_sin(positions, block_embeds.dtype)  # (B * block_size, head_dim) each
        x = block_embeds
        for layer, cache in zip(self.layers, context_caches, strict=True):
            x = layer(x, cos, sin, cache, context)
        return self.norm(x)

    def load_weights(self, folder: Path | str) -> None:
        """Copy every tensor of the folder's safetensors into the parameter of the same name; a missing,
        unexpected or misshapen tensor is an error."""
        folder = Path(folder)
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in iter_safetensors(folder):
            param = params.get(name)
            if param is None:
                raise ValueError(
                    f"{folder}: unexpected tensor {name!r}; a z-lab DFlash checkpoint holds only layers.*, "
                    "fc, hidden_norm and norm (it shares the target's embedding and LM head)"
                )
            if param.shape != tensor.shape:
                raise ValueError(f"{folder}: {self._shape_problem(name, tuple(tensor.shape))}")
            with torch.no_grad():
                param.copy_(tensor)
            loaded.add(name)
        missing = sorted(params.keys() - loaded)
        if missing:
            raise ValueError(
                f"{folder}: {len(missing)} tensors missing from the checkpoint, e.g. {missing[:3]}"
            )

    def _shape_problem(self, name: str, shape: tuple[int, ...]) -> str:
        """Why tensor `name` of `shape` does not fit, naming the config fields that set its shape."""
        expected = tuple(self.get_parameter(name).shape)
        if name == "fc.weight" and len(shape) == 2:
            config = self.config
            return (
                f"fc.weight has shape {shape}: {shape[1]} inputs, but the config's target_layer_ids "
                f"{list(config.target_layer_ids)} ({len(config.target_layer_ids)} layers) x target_hidden_size "
                f"{config.target_hidden_size} make {expected[1]}, and hidden_size {expected[0]} its outputs"
            )
        return f"tensor {name!r} has shape {shape}, the config says {expected}"
