"""Qwen3 dense decoder in plain torch, numerically mirroring transformers' `Qwen3ForCausalLM`.

Module and parameter names follow the Hugging Face checkpoint, except that q/k/v and gate/up are packed into
one matrix each (`PackedLinear`, stored transposed); `load_weights` still reads the checkpoint's names.

Tensor-parallel (a `TensorParallel` of several ranks, Megatron's split as vLLM does it): q/k/v and gate/up
are column-parallel (each rank its query and KV heads, its slice of the MLP's width), o_proj and down_proj
row-parallel with one all-reduce each, the embedding and the LM head vocab-parallel (`VocabMatrix`); norms
are replicated. Each rank reads only its slices of the checkpoint. At one rank nothing of this runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.opaque_ops import attention
from openinfer.engine_core.models.packed_linear import (
    Linear,
    PackedLinear,
    pack_modules_for_cpu,
    row_parallel_linear,
)
from openinfer.engine_core.models.rotary import RotaryEmbedding, apply_rope
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.models.vocab_matrix import VocabMatrix
from openinfer.engine_core.models.weights import Target, load_checkpoint
from openinfer.kernels.attention_backend import AttentionBackend
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.kernel_backends import KernelBackends

SINGLE = TensorParallel.SINGLE


def rms_normalize(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, as transformers computes it but in fewer torch calls:
    pow(2) is x * x, and on the CPU ATen's mean is this very sum, then this division (bit for bit)."""
    inv_rms = (x * x).sum(-1, keepdim=True).div_(x.shape[-1]).add_(eps).rsqrt_()  # (..., 1)
    return x * inv_rms


class RMSNorm(nn.Module):
    """weight * (x / rms(x)) over the last dim, normalised in float32 as transformers does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * rms_normalize(x.float(), self.eps).to(x.dtype)


class Qwen3Attention(nn.Module):
    """Attention over this rank's query heads and the KV heads they read (all of them at one rank)."""

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        parallel: TensorParallel = SINGLE,
        cache_index: int = 0,
    ) -> None:
        super().__init__()
        self.cache_index = cache_index  # which of the model's KV caches this layer's is
        heads = parallel.shard_range(config.num_attention_heads, "attention heads")
        kv_heads = parallel.kv_heads(config.num_key_value_heads)
        self.num_heads, self.num_kv_heads = heads.size, kv_heads.size
        self.head_dim = config.head_dim
        self.scale = config.attention_scale
        bias = config.attention_bias
        q, kv = heads.scaled(self.head_dim), kv_heads.scaled(self.head_dim)  # checkpoint rows of q / k, v
        self.qkv_proj = PackedLinear(
            config.hidden_size,
            {"q_proj": q.size, "k_proj": kv.size, "v_proj": kv.size},
            bias,
            out_shards={"q_proj": q, "k_proj": kv, "v_proj": kv},
        )
        self.o_proj = row_parallel_linear(q, {"o_proj": config.hidden_size}, bias, parallel)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)  # per head, before RoPE
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.attn_backend = attn_backend

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, kv_cache: Tensor | None, attn: AttentionMetadata | None
    ) -> Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x).view(n, -1, self.head_dim)  # (n, heads + 2 * kv_heads, head_dim)
        qk, v = qkv.split([self.num_heads + self.num_kv_heads, self.num_kv_heads], dim=1)
        # q_norm and k_norm in one pass, the same products as two RMSNorm calls: normalise every head, then
        # scale it by its own norm's weight; then RoPE on queries and keys together.
        weight = torch.cat(
            (self.q_norm.weight.expand(self.num_heads, -1), self.k_norm.weight.expand(self.num_kv_heads, -1))
        )  # (heads + kv_heads, head_dim)
        qk = apply_rope(weight * rms_normalize(qk.float(), self.q_norm.eps).to(qk.dtype), cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)  # (n, heads | kv_heads, head_dim)
        out = attention(
            self.attn_backend, q, k, v, kv_cache, attn, self.scale, self.cache_index
        )  # (n, heads, head_dim)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    """SwiGLU MLP in the checkpoint's layout, one `Linear` per projection (for modules loaded by name: a
    drafter's), each packed for the CPU by `pack_modules_for_cpu` (MKL's sgemm by nn.Linear's transposed
    weight took ~80 µs for a draft block's 7 rows x 256 x 768 here, oneDNN's packed copy a fraction)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3PackedMLP(nn.Module):
    """`Qwen3MLP`'s math with gate and up packed into one matmul (`PackedLinear`, loaded through
    `checkpoint_views`); tensor-parallel, each rank its slice of the intermediate width."""

    def __init__(
        self, config: ModelConfig, intermediate_size: int | None = None, parallel: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        full = intermediate_size or config.intermediate_size
        cols = parallel.shard_range(full, "MLP columns (intermediate_size)")
        self.gate_up_proj = PackedLinear(
            config.hidden_size,
            {"gate_proj": cols.size, "up_proj": cols.size},
            False,
            out_shards={"gate_proj": cols, "up_proj": cols},
        )
        self.down_proj = row_parallel_linear(cols, {"down_proj": config.hidden_size}, False, parallel)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (n, intermediate_size) each
        return self.down_proj(F.silu(gate) * up)


# The MLP of decoder layer i (a MoE model's sparse block), or None for the dense `Qwen3PackedMLP`.
MlpForLayer = Callable[[int], nn.Module | None]


class Qwen3DecoderLayer(nn.Module):
    has_kv_cache = True  # every Qwen3 layer attends through its own KV cache

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        mlp: nn.Module | None = None,
        parallel: TensorParallel = SINGLE,
        index: int = 0,
    ) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(config, attn_backend, parallel, cache_index=index)
        self.mlp = mlp if mlp is not None else Qwen3PackedMLP(config, parallel=parallel)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: Tensor,
        cos: Tensor,
        sin: Tensor,
        kv_cache: Tensor | None,
        attn: AttentionMetadata | None,
    ) -> Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, attn)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderStack(nn.Module):
    """Embedding, decoder layers, final norm: the stack a causal LM runs (`Qwen3Model`, Qwen3.5's hybrid
    `Qwen3_5Model`). `kv_caches` holds the caches of the layers that attend (`has_kv_cache`), in layer order;
    the others (Gated DeltaNet) keep their state in their own slots."""

    embed_tokens: VocabMatrix | nn.Embedding
    layers: nn.ModuleList
    norm: nn.Module
    rotary: RotaryEmbedding

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: Sequence[Tensor],
        attn: AttentionMetadata | None,
        aux_layer_ids: Sequence[int] = (),
    ) -> tuple[Tensor, list[Tensor]]:
        """The final norm of the last layer's output, and the aux layers' outputs in the order asked:
        transformers' last hidden state is taken after the final norm, so the last layer's aux is too.
        ``attn`` is None only while torch.compile traces the stack (compiled_forward.py: the opaque ops read
        the step's metadata from their step context)."""
        hidden = self.embed_tokens(input_ids)  # (num_tokens, hidden_size)
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)  # (num_tokens, rotary dims) each
        caches = iter(kv_caches)
        aux: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, cos, sin, next(caches) if layer.has_kv_cache else None, attn)
            if i in aux_layer_ids:
                aux[i] = hidden
        hidden = self.norm(hidden)
        if len(self.layers) - 1 in aux:
            aux[len(self.layers) - 1] = hidden
        return hidden, [aux[i] for i in aux_layer_ids]


class Qwen3Model(DecoderStack):
    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        mlp_for_layer: MlpForLayer = lambda i: None,
        parallel: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.embed_tokens = vocab_embedding(config, parallel)
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(config, attn_backend, mlp_for_layer(i), parallel, index=i)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings)


def vocab_embedding(config: ModelConfig, parallel: TensorParallel = SINGLE) -> VocabMatrix | nn.Embedding:
    """The token embedding. Tied: it is the LM head too, held transposed for the head's matmul (VocabMatrix).
    Untied: a plain row-major embedding; given its (uninitialised) weight, nn.Embedding skips its random init
    (load_weights fills it; normal_ would import torch._dynamo, ~1.5 s of every engine's start-up).
    Vocab-parallel (several ranks): a VocabMatrix, tied or not (its lookup masks and sums over the ranks)."""
    if config.tie_word_embeddings or not parallel.single:
        return VocabMatrix(config.vocab_size, config.hidden_size, parallel)
    weight = torch.empty(config.vocab_size, config.hidden_size)
    return nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)


class Qwen3ForCausalLM(nn.Module):
    """Qwen3 dense causal LM over a paged KV cache; every request's new tokens are packed into one batch.

    `kv_caches` holds one tensor per layer, (2, num_blocks, block_size, num_kv_heads, head_dim).
    """

    def __init__(
        self,
        config: ModelConfig,
        kernels: KernelBackends,
        mlp_for_layer: MlpForLayer = lambda i: None,
        model: DecoderStack | None = None,
        parallel: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.config = config
        self.parallel = parallel  # this rank's place; the layers hold their own slices
        # `model`: another decoder stack (Qwen3.5's hybrid one); the layers run the kernels of `kernels`
        self.model: DecoderStack = (
            model if model is not None else Qwen3Model(config, kernels.attention, mlp_for_layer, parallel)
        )
        # Tied checkpoints have no lm_head.weight: the embedding matrix serves as the head.
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else VocabMatrix(config.vocab_size, config.hidden_size, parallel)
        )

    def forward(
        self, input_ids: Tensor, positions: Tensor, kv_caches: list[Tensor], attn: AttentionMetadata
    ) -> Tensor:
        """input_ids, positions: (num_tokens,) int64. Returns the final hidden states (num_tokens, hidden)."""
        hidden, _ = self.model(input_ids, positions, kv_caches, attn)
        return hidden

    def forward_with_aux(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: list[Tensor],
        attn: AttentionMetadata,
        aux_layer_ids: Sequence[int],
    ) -> tuple[Tensor, list[Tensor]]:
        """Like `forward`, also returning the output of each decoder layer in `aux_layer_ids` (0-based,
        each (num_tokens, hidden_size)): transformers' `hidden_states[i + 1]`, which is the layer's output
        for every layer but the last, and the final norm's output for the last."""
        for i in aux_layer_ids:
            if not 0 <= i < self.config.num_hidden_layers:
                raise ValueError(
                    f"aux layer {i} is out of range: the model has {self.config.num_hidden_layers}"
                )
        return self.model(input_ids, positions, kv_caches, attn, aux_layer_ids)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden_size) -> (n, vocab_size) float32 (no copy when the model is float32); tensor-parallel,
        every rank's vocabulary slice gathered, so each rank returns the whole logits."""
        head = self.lm_head if self.lm_head is not None else self.model.embed_tokens
        assert isinstance(head, VocabMatrix)  # tied: the embedding is one
        return head.logits(hidden).float()

    def pack_for_cpu(self) -> None:
        """Give every projection and the LM head a oneDNN-packed copy (`pack_modules_for_cpu`)."""
        pack_modules_for_cpu(self)

    def load_weights(self, folder: Path) -> None:
        """Copy every tensor of the folder's safetensors (one file or an indexed set of shards) into the
        parameter, or the part of a packed parameter, of the same Hugging Face name (tensor-parallel: only
        this rank's slice of a sharded tensor is read); a missing, unexpected or misshapen tensor is an
        error."""
        load_checkpoint(
            Path(folder),
            self.checkpoint_tensors(),
            unexpected_hint=" (is this a Qwen3 dense checkpoint?)",
            # some tied checkpoints still store the head; it equals the embedding
            skip=lambda name: name == "lm_head.weight" and self.lm_head is None,
        )

    def checkpoint_tensors(self) -> dict[str, Target]:
        """Every tensor a Hugging Face checkpoint of this model holds, by its name there: a parameter, or a
        view of a packed parameter in the checkpoint tensor's shape (writing it writes the parameter); for a
        sharded tensor, the view of this rank's slice and where that slice lies (`CheckpointSlice`)."""
        targets: dict[str, Target] = {}
        for path, module in self.named_modules():
            if isinstance(module, PackedLinear):
                parent = path.rpartition(".")[0]  # "model.layers.0.self_attn" for its qkv_proj
                targets.update((f"{parent}.{name}", view) for name, view in module.checkpoint_views())
            elif isinstance(module, VocabMatrix):
                targets[f"{path}.weight"] = module.checkpoint_target()  # (vocab, hidden): a view of weight_t
            else:
                prefix = f"{path}." if path else ""
                targets.update((prefix + name, p) for name, p in module.named_parameters(recurse=False))
        return targets
