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

import os
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from openinfer.engine_core.models.block_attention import BlockAttention, BlockContext, torch_block_attention
from openinfer.engine_core.models.checkpoint_headers import check_headers
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.dflash_context import ContextProjection
from openinfer.engine_core.models.dspark_heads import SAMPLED_CONFIDENCE_FILE, ConfidenceHead, MarkovHead
from openinfer.engine_core.models.packed_linear import Linear
from openinfer.engine_core.models.qwen3 import Qwen3MLP, RMSNorm
from openinfer.engine_core.models.rotary import RotaryEmbedding, apply_rope
from openinfer.engine_core.models.weights import load_checkpoint

# A DeepSpec checkpoint's copies of the target's embedding and LM head: the target's own serve the drafter.
_DEEPSPEC_TARGET_COPIES = frozenset({"embed_tokens.weight", "lm_head.weight"})


class DFlashAttention(nn.Module):
    """Qwen3 attention: queries from the block; keys/values from the context, then from the block."""

    def __init__(self, config: ModelConfig, attention: BlockAttention) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.scale = config.head_dim, config.attention_scale
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = Linear(hidden, config.q_width, bias=bias)
        self.k_proj = Linear(hidden, config.kv_width, bias=bias)
        self.v_proj = Linear(hidden, config.kv_width, bias=bias)
        self.o_proj = Linear(config.q_width, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.attention = attention

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
        out = self.attention(q, k, v, cache, context, self.scale)  # (B, T, heads, head_dim)
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, attention: BlockAttention) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config, attention)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, context: BlockContext) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, context)
        return x + self.mlp(self.post_attention_layernorm(x))


_SAMPLED_HINT = (  # after an unexpected tensor's name in SAMPLED_CONFIDENCE_FILE
    f"; {SAMPLED_CONFIDENCE_FILE} holds sampled_confidence_head.proj.weight and .bias, a confidence head's shape"
)


class DFlashDraftModel(nn.Module):
    """The draft layers, fc, hidden_norm and the final norm; parameter names equal z-lab's checkpoint names.
    A DeepSpec checkpoint adds DSpark's `markov_head` and `confidence_head` (dspark_heads.py) when its config
    has them (and `sampled_confidence_head`, from SAMPLED_CONFIDENCE_FILE, when it names
    `sampled_confidence_temperature`), and its copies of the target's `embed_tokens` and `lm_head`, which are
    not loaded: the target's serve (DeepSpec copies them from the target and freezes them).

    The context cache is one tensor (num_layers, 2, num_pages, page_size, num_kv_heads, head_dim), filled by
    `write_context` (all layers at once) and read by `forward`, a layer's slice each, through `attention`.
    With `max_positions`, RoPE is looked up in a table of the positions below it, built on first use (no
    host-to-device copy per call, so a forward can be captured in a CUDA graph).
    """

    def __init__(
        self,
        config: DFlashConfig,
        attention: BlockAttention = torch_block_attention,
        max_positions: int | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        layers = config.layers
        self.layers = nn.ModuleList(
            DFlashDecoderLayer(layers, attention) for _ in range(layers.num_hidden_layers)
        )
        self.fc = Linear(
            len(config.target_layer_ids) * config.target_hidden_size, layers.hidden_size, bias=False
        )
        self.hidden_norm = RMSNorm(layers.hidden_size, layers.rms_norm_eps)
        self.norm = RMSNorm(layers.hidden_size, layers.rms_norm_eps)
        self.rotary = RotaryEmbedding(layers.head_dim, layers.rope_theta, max_positions)
        heads = config.heads
        self.markov_head: MarkovHead | None = None
        self.confidence_head: ConfidenceHead | None = None
        self.sampled_confidence_head: ConfidenceHead | None = None  # read for requests at T > 0
        if heads is not None and heads.markov_rank > 0:
            self.markov_head = MarkovHead(
                layers.vocab_size, heads.markov_rank, layers.hidden_size, heads.markov_head_type
            )
        if heads is not None and heads.confidence_head:
            self.confidence_head = ConfidenceHead(
                layers.hidden_size, heads.markov_rank, heads.confidence_with_markov
            )
        if heads is not None and heads.sampled_confidence_temperature is not None:
            self.sampled_confidence_head = ConfidenceHead(
                layers.hidden_size, heads.markov_rank, heads.confidence_with_markov
            )
        self.context_projection: ContextProjection | None = None  # fuse_context, once loaded

    def fuse_context(self, pack: bool) -> None:
        """Fuse the loaded layers' context projections for `write_context` (`ContextProjection`; ``pack``:
        with a oneDNN-packed copy, as `pack_modules_for_cpu` gives the other projections)."""
        attns = [cast("DFlashDecoderLayer", layer).self_attn for layer in self.layers]
        self.context_projection = ContextProjection(
            [a.k_proj for a in attns],
            [a.v_proj for a in attns],
            [a.k_norm.weight for a in attns],
            attns[0].k_norm.eps,
            attns[0].num_kv_heads,
            pack,
        )

    def write_context(
        self, aux_hidden: Tensor, positions: Tensor, slot_mapping: Tensor, context_cache: Tensor
    ) -> None:
        """aux_hidden (n, len(target_layer_ids) * target_hidden): the target's layer outputs at `positions`
        (n,); every draft layer's context key/value for them goes to `slot_mapping` (n,) of its cache,
        context_cache[layer] (`fuse_context` first)."""
        if self.context_projection is None:
            raise RuntimeError("write_context needs the fused projections: call fuse_context after loading")
        features = self.hidden_norm(self.fc(aux_hidden))  # (n, hidden)
        cos, sin = self.rotary.cos_sin(positions, features.dtype)  # (n, head_dim) each
        self.context_projection.write(features, cos, sin, context_cache, slot_mapping)

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

    def check_checkpoint(self, folder: Path | str) -> None:
        """Refuse, from the safetensors headers alone (nothing allocated, no tensor read), a checkpoint whose
        tensors are not this model's parameters by name and shape (DeepSpec's copies of the target's
        embedding and LM head may be there, (vocab, hidden) each), or not floating-point."""
        layers = self.config.layers
        copies = (layers.vocab_size, layers.hidden_size)
        checkpoint, sampled = self._checkpoint_files_parameters()
        check_headers(
            Path(folder),
            {name: tuple(param.shape) for name, param in checkpoint.items()},
            unexpected_hint=self._unexpected_hint,
            optional=dict.fromkeys(_DEEPSPEC_TARGET_COPIES, copies) if self.config.is_deepspec else None,
            shape_problem=self._shape_problem,
        )
        if sampled and not os.path.lexists(Path(folder) / SAMPLED_CONFIDENCE_FILE):
            raise ValueError(
                f"{folder}: config.json names sampled_confidence_temperature but {SAMPLED_CONFIDENCE_FILE} is "
                "not there; copy it with the checkpoint, or remove the key to read the greedy head alone"
            )
        if sampled:
            check_headers(
                Path(folder),
                {name: tuple(param.shape) for name, param in sampled.items()},
                unexpected_hint=_SAMPLED_HINT,
                files=[SAMPLED_CONFIDENCE_FILE],
            )

    def load_weights(self, folder: Path | str) -> None:
        """Copy every tensor of the folder's safetensors into the parameter of the same name; a missing,
        unexpected or misshapen tensor is an error, and so is a NaN or infinite weight (as loaded, in the
        parameter's dtype: a float32 weight past float16's range is infinite in a float16 engine)."""
        deepspec = self.config.is_deepspec
        checkpoint, sampled = self._checkpoint_files_parameters()
        load_checkpoint(
            Path(folder),
            checkpoint,
            unexpected_hint=self._unexpected_hint,
            skip=lambda name: deepspec and name in _DEEPSPEC_TARGET_COPIES,
            shape_problem=self._shape_problem,
        )
        if sampled:
            load_checkpoint(
                Path(folder), sampled, unexpected_hint=_SAMPLED_HINT, files=[SAMPLED_CONFIDENCE_FILE]
            )
        for name, param in self.named_parameters():
            if not bool(torch.isfinite(param).all()):
                raise ValueError(
                    f"{folder}: tensor {name!r} holds NaN or infinite values (as {param.dtype}); a drafter's "
                    "weights must be finite"
                )

    def _checkpoint_files_parameters(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The parameters model.safetensors holds, and those of SAMPLED_CONFIDENCE_FILE (none without it)."""
        checkpoint: dict[str, Tensor] = {}
        sampled: dict[str, Tensor] = {}
        for name, param in self.named_parameters():
            (sampled if name.startswith("sampled_confidence_head.") else checkpoint)[name] = param
        return checkpoint, sampled

    @property
    def _unexpected_hint(self) -> str:
        if self.config.is_deepspec:
            return (
                "; a DeepSpec checkpoint holds layers.*, fc, hidden_norm, norm, embed_tokens, lm_head and the "
                "heads its config names (markov_rank, enable_confidence_head)"
            )
        return (
            "; a z-lab DFlash checkpoint holds only layers.*, fc, hidden_norm and norm (it shares the "
            "target's embedding and LM head)"
        )

    def _shape_problem(self, name: str, shape: tuple[int, ...]) -> str | None:
        """Why fc.weight of `shape` does not fit, naming the config fields that set its shape (None for any
        other tensor: the loader's message names both shapes)."""
        if name == "fc.weight" and len(shape) == 2:
            config, expected = self.config, tuple(self.fc.weight.shape)
            return (
                f"fc.weight has shape {shape}: {shape[1]} inputs, but the config's target_layer_ids "
                f"{list(config.target_layer_ids)} ({len(config.target_layer_ids)} layers) x target_hidden_size "
                f"{config.target_hidden_size} make {expected[1]}, and hidden_size {expected[0]} its outputs"
            )
        return None
