"""Qwen3 dense decoder in plain torch, numerically mirroring transformers' `Qwen3ForCausalLM`.

Parameter names equal the Hugging Face checkpoint names, so loading is a name-for-name copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from openinfer.engine_core.models.config import ModelConfig
from openinfer.kernels.attention import AttentionBackend, AttentionMetadata


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim, computed in float32 as transformers does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding:
    """RoPE tables for the given positions, in transformers' rotate_half layout (two halves, not pairs)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        # Computed once on the CPU, like transformers, so every device starts from the same frequencies.
        self.inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)
        )

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * inv_freq[None, :]  # (num_tokens, head_dim // 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (num_tokens, head_dim)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (num_tokens, heads, head_dim); cos/sin (num_tokens, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Qwen3Attention(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
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
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)  # per head, before RoPE
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.attn_backend = attn_backend

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, kv_cache: Tensor, attn: AttentionMetadata
    ) -> Tensor:
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.num_heads, self.head_dim))  # (n, heads, head_dim)
        k = self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim))  # (n, kv_heads, head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.attn_backend.forward(q, k, v, kv_cache, attn, self.scale)  # (n, heads, head_dim)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(config, attn_backend)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, hidden: Tensor, cos: Tensor, sin: Tensor, kv_cache: Tensor, attn: AttentionMetadata
    ) -> Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, attn)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Qwen3Model(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(config, attn_backend) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv_caches: list[Tensor],
        attn: AttentionMetadata,
        aux_layer_ids: Sequence[int] = (),
    ) -> tuple[Tensor, list[Tensor]]:
        hidden = self.embed_tokens(input_ids)  # (num_tokens, hidden_size)
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)  # (num_tokens, head_dim) each
        aux: dict[int, Tensor] = {}
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            hidden = layer(hidden, cos, sin, kv_cache, attn)
            if i in aux_layer_ids:
                aux[i] = hidden
        return self.norm(hidden), [aux[i] for i in aux_layer_ids]


class Qwen3ForCausalLM(nn.Module):
    """Qwen3 dense causal LM over a paged KV cache; every request's new tokens are packed into one batch.

    `kv_caches` holds one tensor per layer, (2, num_blocks, block_size, num_kv_heads, head_dim).
    """

    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen3Model(config, attn_backend)
        # Tied checkpoints have no lm_head.weight: the embedding matrix serves as the head.
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
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
        each (num_tokens, hidden_size), before the final norm: transformers' `hidden_states[i + 1]` for
        every layer but the last, whose transformers entry is taken after the final norm)."""
        for i in aux_layer_ids:
            if not 0 <= i < self.config.num_hidden_layers:
                raise ValueError(
                    f"aux layer {i} is out of range: the model has {self.config.num_hidden_layers}"
                )
        return self.model(input_ids, positions, kv_caches, attn, aux_layer_ids)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden_size) -> (n, vocab_size) float32."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()

    def load_weights(self, folder: Path) -> None:
        """Copy every tensor of the folder's safetensors (one file or an indexed set of shards) into the
        parameters of the same name; a missing, unexpected or misshapen tensor is an error."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in _safetensors_items(Path(folder)):
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # some tied checkpoints still store the head; it equals the embedding
            param = params.get(name)
            if param is None:
                raise ValueError(f"{folder}: unexpected tensor {name!r} (is this a Qwen3 dense checkpoint?)")
            if param.shape != tensor.shape:
                raise ValueError(
                    f"{folder}: tensor {name!r} has shape {tuple(tensor.shape)}, the config says "
                    f"{tuple(param.shape)}"
                )
            with torch.no_grad():
                param.copy_(tensor)
            loaded.add(name)
        missing = sorted(params.keys() - loaded)
        if missing:
            raise ValueError(
                f"{folder}: {len(missing)} tensors missing from the checkpoint, e.g. {missing[:3]}"
            )


def _safetensors_items(folder: Path) -> Iterator[tuple[str, Tensor]]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder} holds neither model.safetensors nor model.safetensors.index.json")
    for file in files:
        with safe_open(str(folder / file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
