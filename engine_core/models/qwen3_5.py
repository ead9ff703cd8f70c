"""Qwen3.5 text decoder (dense and MoE) in plain torch, numerically mirroring transformers' `Qwen3_5ForCausalLM`
and `Qwen3_5MoeForCausalLM`: a hybrid of Gated DeltaNet layers (gated_deltanet.py) and gated full-attention
layers, `layer_types` saying which.

Beside Qwen3 (qwen3.py): every RMSNorm but the DeltaNet's output norm is zero-centred, x / rms(x) * (1 + w);
a full-attention layer's query projection also yields a per-head output gate, sigmoid(gate) * attention, and
RoPE turns only the first `rotary_dim` dims of each head (text positions make mRoPE plain 1-D RoPE); the MoE
variant's every layer routes to experts (always renormalised) and adds a shared expert gated by
sigmoid(shared_expert_gate(x)).

Released checkpoints are vision-language: the text weights are read under `model.language_model.*`, the
vision tower (`model.visual.*`) and the multi-token-prediction head (`mtp.*`) are skipped.

Tensor-parallel: the Gated DeltaNet layers split by heads (gated_deltanet.py), the full-attention layers as
Qwen3's (each rank its query heads, with their interleaved gate rows, and its KV heads; o_proj
row-parallel), the dense MLP, embedding and LM head as Qwen3's, the MoE block as Qwen3-MoE's with its
shared expert split by width inside the block's one all-reduce.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.gated_deltanet import GatedDeltaNet
from openinfer.engine_core.models.hybrid_config import HybridConfig, text_weight_name
from openinfer.engine_core.models.opaque_ops import attention, deltanet
from openinfer.engine_core.models.packed_linear import PackedLinear, row_parallel_linear
from openinfer.engine_core.models.qwen3 import (
    SINGLE,
    DecoderStack,
    Qwen3ForCausalLM,
    Qwen3PackedMLP,
    rms_normalize,
    vocab_embedding,
)
from openinfer.engine_core.models.qwen3_moe import (
    Qwen3MoeExperts,
    Qwen3MoeSparseBlock,
    holds_stacked_experts,
    other_experts,
)
from openinfer.engine_core.models.rotary import RotaryEmbedding, apply_rope
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.models.weights import Target, checkpoint_names, load_checkpoint
from openinfer.kernels.attention_backend import AttentionBackend
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.kernel_backends import ExpertsBackend, KernelBackends


class ZeroCenteredRMSNorm(nn.Module):
    """(x / rms(x)) * (1 + weight) over the last dim, all in float32, cast back (transformers'
    `Qwen3_5RMSNorm`: the checkpoint's weight is the offset from 1)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return (rms_normalize(x.float(), self.eps) * (1.0 + self.weight.float())).to(x.dtype)


class GatedAttention(nn.Module):
    """Full attention whose query projection also yields a per-head output gate (q_proj's rows alternate
    per head: head_dim query rows, then head_dim gate rows), over this rank's query heads and the KV heads
    they read (all of them at one rank)."""

    def __init__(
        self,
        config: ModelConfig,
        hybrid: HybridConfig,
        attn_backend: AttentionBackend,
        parallel: TensorParallel = SINGLE,
        cache_index: int = 0,
    ) -> None:
        super().__init__()
        self.cache_index = (
            cache_index  # which of the model's KV caches (its full-attention layers') is this one's
        )
        heads = parallel.shard_range(config.num_attention_heads, "attention heads")
        kv_heads = parallel.kv_heads(config.num_key_value_heads)
        self.num_heads, self.num_kv_heads = heads.size, kv_heads.size
        self.head_dim, self.rotary_dim = config.head_dim, hybrid.rotary_dim
        self.scale = config.attention_scale
        bias = config.attention_bias
        # checkpoint rows of q_proj (a head's query and gate rows together), of k_proj / v_proj
        query_gate, kv = heads.scaled(2 * self.head_dim), kv_heads.scaled(self.head_dim)
        self.qkv_proj = PackedLinear(
            config.hidden_size,
            {"q_proj": query_gate.size, "k_proj": kv.size, "v_proj": kv.size},
            bias,
            out_shards={"q_proj": query_gate, "k_proj": kv, "v_proj": kv},
        )
        queries = heads.scaled(self.head_dim)  # o_proj's input columns
        self.o_proj = row_parallel_linear(queries, {"o_proj": config.hidden_size}, bias, parallel)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.attn_backend = attn_backend

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, kv_cache: Tensor | None, attn: AttentionMetadata | None
    ) -> Tensor:
        n, heads, dim = x.shape[0], self.num_heads, self.head_dim
        query_gate, k, v = self.qkv_proj(x).split(
            [2 * heads * dim, self.num_kv_heads * dim, self.num_kv_heads * dim], dim=-1
        )
        q, gate = query_gate.view(n, heads, 2 * dim).chunk(2, dim=-1)  # (n, heads, head_dim) each
        q = self._rope(self.q_norm(q), cos, sin)
        k = self._rope(self.k_norm(k.view(n, self.num_kv_heads, dim)), cos, sin)
        v = v.view(n, self.num_kv_heads, dim)
        out = attention(
            self.attn_backend, q, k, v, kv_cache, attn, self.scale, self.cache_index
        )  # (n, heads, head_dim)
        out = out.reshape(n, heads * dim) * torch.sigmoid(gate.reshape(n, heads * dim))
        return self.o_proj(out)

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """RoPE on the first rotary_dim dims of each head, the rest passed through; (n, h, head_dim)."""
        if self.rotary_dim == self.head_dim:
            return apply_rope(x, cos, sin)
        return torch.cat((apply_rope(x[..., : self.rotary_dim], cos, sin), x[..., self.rotary_dim :]), dim=-1)


class SharedExpertMoe(Qwen3MoeSparseBlock):
    """Qwen3.5-MoE's block: Qwen3-MoE's router and experts (its config always renormalises the top-k) plus a
    shared SwiGLU expert scaled by sigmoid(shared_expert_gate(x)).

    Tensor-parallel, the experts as Qwen3-MoE's and the shared expert split by its width (the gate, one
    column, replicated): each rank adds its slice's partial product to its experts' share, and the block's
    one all-reduce sums both (the gate scales every rank's partial alike)."""

    def __init__(
        self, config: ModelConfig, experts: ExpertsBackend, parallel: TensorParallel = SINGLE
    ) -> None:
        moe = config.moe
        assert moe is not None
        super().__init__(config.hidden_size, moe, experts, parallel)
        width = moe.shared_expert_intermediate_size
        self.shared_expert = Qwen3PackedMLP(config, width, parallel)
        cols = parallel.shard_range(width, "shared expert columns (shared_expert_intermediate_size)")
        # down_proj's partial product only (no all-reduce of its own): the block's all-reduce sums it
        self.shared_expert.down_proj = PackedLinear(
            cols.size, {"down_proj": config.hidden_size}, False, in_shard=cols
        )
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def partial(self, x: Tensor) -> Tensor:
        """(n, H) -> (n, H): this rank's experts' share plus its slice of the gated shared expert."""
        return super().partial(x) + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class HybridDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer: int, kernels: KernelBackends, parallel: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        hybrid = config.hybrid
        assert hybrid is not None
        self.is_linear = hybrid.is_linear(layer)
        self.has_kv_cache = not self.is_linear  # a full-attention layer reads the next of the model's caches
        earlier = [hybrid.is_linear(i) for i in range(layer)]
        # this layer's place among the model's DeltaNet layers, or among its full-attention layers' caches
        self.index = earlier.count(True) if self.is_linear else earlier.count(False)
        self.linear_attn = (
            GatedDeltaNet(config.hidden_size, hybrid, config.rms_norm_eps, kernels, parallel)
            if self.is_linear
            else None
        )
        self.self_attn = (
            None
            if self.is_linear
            else GatedAttention(config, hybrid, kernels.attention, parallel, cache_index=self.index)
        )
        self.mlp: nn.Module = (
            SharedExpertMoe(config, kernels.moe, parallel)
            if config.moe is not None
            else Qwen3PackedMLP(config, parallel=parallel)
        )
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: Tensor,
        cos: Tensor,
        sin: Tensor,
        kv_cache: Tensor | None,
        attn: AttentionMetadata | None,
    ) -> Tensor:
        x = self.input_layernorm(hidden)
        if self.linear_attn is not None:
            mixed = deltanet(self.linear_attn, x, attn, self.index)
        else:
            assert self.self_attn is not None
            mixed = self.self_attn(x, cos, sin, kv_cache, attn)
        hidden = hidden + mixed
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Qwen3_5Model(DecoderStack):
    """Embedding, hybrid layers, final norm. `kv_caches` holds the full-attention layers' caches only, in
    layer order; the DeltaNet layers keep their state in their own slots."""

    def __init__(
        self, config: ModelConfig, kernels: KernelBackends, parallel: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        hybrid = config.hybrid
        assert hybrid is not None
        self.embed_tokens = vocab_embedding(config, parallel)
        self.layers = nn.ModuleList(
            HybridDecoderLayer(config, i, kernels, parallel) for i in range(config.num_hidden_layers)
        )
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(hybrid.rotary_dim, config.rope_theta, config.max_position_embeddings)


class Qwen3_5ForCausalLM(Qwen3ForCausalLM):
    """Qwen3.5 (dense or MoE) causal LM: `Qwen3ForCausalLM`'s interface (forward, aux layers, logits, CPU
    packing) over a hybrid stack. `allocate_states` gives the DeltaNet layers their state slots."""

    def __init__(
        self, config: ModelConfig, kernels: KernelBackends, parallel: TensorParallel = SINGLE
    ) -> None:
        if config.hybrid is None:
            raise ValueError("Qwen3_5ForCausalLM needs a Qwen3.5 config (layer_types); this one is Qwen3")
        super().__init__(config, kernels, model=Qwen3_5Model(config, kernels, parallel), parallel=parallel)

    @property
    def linear_layers(self) -> list[GatedDeltaNet]:
        return [module for module in self.modules() if isinstance(module, GatedDeltaNet)]  # in layer order

    def allocate_states(self, num_slots: int, device: torch.device) -> None:
        """Zeroed conv and recurrent states for `num_slots` slots in every DeltaNet layer."""
        for layer in self.linear_layers:
            layer.allocate_states(num_slots, device)

    def copy_states(self, sources: Tensor, destinations: Tensor) -> None:
        """Slot destinations[m] takes slot sources[m]'s state in every DeltaNet layer ((M,) int64 each)."""
        for layer in self.linear_layers:
            assert layer.conv_state is not None and layer.recurrent_state is not None
            layer.conv_state.index_copy_(0, destinations, layer.conv_state.index_select(0, sources))
            layer.recurrent_state.index_copy_(0, destinations, layer.recurrent_state.index_select(0, sources))

    @property
    def state_bytes(self) -> int:
        """Bytes one state slot takes across all DeltaNet layers."""
        return sum(layer.state_bytes for layer in self.linear_layers)

    def load_weights(self, folder: Path) -> None:
        """Copy the text weights of a released (vision-language) or a text-only checkpoint, the experts in
        whichever form it holds them; the vision tower and the MTP head are skipped, and so, under expert
        parallelism, are the other ranks' experts."""
        folder = Path(folder)
        names = checkpoint_names(folder)
        others = set(other_experts(self))
        targets = self.checkpoint_tensors(stacked_experts=holds_stacked_experts(names))
        # keyed by the checkpoint's names; a text tensor the checkpoint lacks keeps its name (reported missing)
        renamed = {name: targets[text] for name in names if (text := text_weight_name(name)) in targets}
        present = {text_weight_name(name) for name in names}
        renamed.update((text, target) for text, target in targets.items() if text not in present)
        load_checkpoint(
            folder,
            renamed,
            unexpected_hint=" (is this a Qwen3.5 checkpoint of this config.json?)",
            skip=lambda name: (
                (text := text_weight_name(name)) is None
                or text in others
                or (name == "lm_head.weight" and self.lm_head is None)
            ),
        )

    def checkpoint_tensors(self, stacked_experts: bool = True) -> dict[str, Target]:
        """Every text tensor by its name in a text-only checkpoint (`model.layers.N...`), the experts stacked
        (transformers 5's names) or per expert (`mlp.experts.E.gate_proj.weight`, ...); tensor-parallel, the
        rank's slices (its DeltaNet heads, its experts or their widths)."""
        targets = super().checkpoint_tensors()
        for path, module in self.named_modules():
            if isinstance(module, GatedDeltaNet):
                targets.update((f"{path}.{name}", view) for name, view in module.sharded_targets().items())
            elif isinstance(module, Qwen3MoeExperts):
                del targets[f"{path}.gate_up_proj"], targets[f"{path}.down_proj"]
                views = module.stacked_targets() if stacked_experts else module.per_expert_views()
                targets.update((f"{path}.{name}", view) for name, view in views)
        return targets
