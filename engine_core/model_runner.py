"""Runs the target model over a step's chunks; owns the weights, the paged KV cache, the attention backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from openinfer.engine_core.executor import SeqChunk, check_chunk, check_kv_geometry, resolve_dtype
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.engine_core.step_graphs import StepGraphs
from openinfer.kernels.attention import AttentionMetadata, host_to_device, select_backend


@dataclass(frozen=True)
class _StepInputs:
    input_ids: Tensor  # (num_tokens,) int64
    positions: Tensor  # (num_tokens,) int64
    attn: AttentionMetadata
    logits_indices: Tensor  # (sum of num_logits,) int64: rows of the hidden states to turn into logits


class ModelRunner:
    """Loads a Qwen3 folder onto `device` and runs batched steps over a paged KV cache of
    `num_kv_blocks` blocks of `block_size` tokens (allocated zeroed, once, here, with one scratch block
    past them for padding), attending through the `attention_backend` that `select_backend` names (auto:
    Triton on CUDA, torch on the CPU).

    Decode and verify steps run as padded fixed shapes from CUDA graphs on CUDA when the attention backend
    allows it, unless ``enforce_eager`` (see :mod:`step_graphs`); everything else runs eagerly.
    """

    def __init__(
        self,
        model_path: Path,
        device: torch.device,
        num_kv_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype | None = None,
        attention_backend: str = "auto",
        enforce_eager: bool = False,
        max_num_seqs: int = 256,
    ) -> None:
        check_kv_geometry(num_kv_blocks, block_size)
        self.device = torch.device(device)
        if self.device.type == "cuda":  # Triton launches and graph capture use the current device
            torch.cuda.set_device(self.device.index or 0)
        self.dtype = dtype or resolve_dtype("auto", self.device)
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.model_config = config = ModelConfig.from_folder(model_path)
        self.attn_backend = select_backend(self.device, attention_backend, block_size)
        with torch.device("meta"):  # no throwaway random init; load_weights fills every parameter
            model = Qwen3ForCausalLM(config, self.attn_backend)
        self.model = model.to(self.dtype).to_empty(device=self.device).eval()
        self.model.load_weights(Path(model_path))
        # (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim) in one allocation, a view per layer.
        # Block num_kv_blocks is the scratch block padded steps write into.
        cache_shape = (2, num_kv_blocks + 1, block_size, config.num_key_value_heads, config.head_dim)
        caches = torch.zeros((config.num_hidden_layers, *cache_shape), dtype=self.dtype, device=self.device)
        self.kv_caches: list[Tensor] = list(caches.unbind(0))
        capture = self.device.type == "cuda" and not enforce_eager and self.attn_backend.cuda_graphs
        self.step_graphs: StepGraphs | None = None
        if capture:
            self.step_graphs = StepGraphs(
                self.model, self.kv_caches, block_size, num_kv_blocks, config.max_position_embeddings,
                max_num_seqs, capture=True,
            )  # fmt: skip

    @staticmethod
    def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """Bytes of KV cache one block takes across all layers (keys and values)."""
        per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
        return per_token * block_size * dtype.itemsize

    @torch.inference_mode()
    def execute_with_aux(self, chunks: list[SeqChunk], aux_layer_ids: Sequence[int]) -> tuple[Tensor, Tensor]:
        """:meth:`execute`, plus the outputs of decoder layers ``aux_layer_ids`` at every token.

        Returns logits as ``execute`` does and aux (num_tokens, len(aux_layer_ids) * hidden), the chosen
        layers' outputs concatenated in order, rows in chunk order (a drafter's context features).
        """
        padded = self._padded(chunks)
        if self.step_graphs is not None and padded is not None:
            logits, padded_aux = self.step_graphs.run(chunks, *padded, aux_layer_ids)
            assert padded_aux is not None
            return logits, padded_aux
        inputs = self._prepare(chunks)
        hidden, aux = self.model.forward_with_aux(
            inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn, aux_layer_ids=list(aux_layer_ids)
        )
        return self.model.compute_logits(hidden[inputs.logits_indices]), torch.cat(aux, dim=-1)

    @torch.inference_mode()
    def execute(self, chunks: list[SeqChunk]) -> Tensor:
        """Run every chunk's new tokens in one forward pass, writing their keys and values into the cache.

        Returns (sum of num_logits, vocab_size) float32: each chunk's logits for its last num_logits tokens,
        in chunk order.
        """
        padded = self._padded(chunks)
        if self.step_graphs is not None and padded is not None:
            return self.step_graphs.run(chunks, *padded)[0]
        inputs = self._prepare(chunks)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn)
        return self.model.compute_logits(hidden[inputs.logits_indices])

    def _padded(self, chunks: list[SeqChunk]) -> tuple[int, int] | None:
        """Check every chunk; (bucket, q) when the step runs padded through ``step_graphs``."""
        if not chunks:
            raise ValueError("execute needs at least one chunk")
        for chunk in chunks:
            check_chunk(chunk, self)
        return self.step_graphs.fits(chunks) if self.step_graphs is not None else None

    def _prepare(self, chunks: list[SeqChunk]) -> _StepInputs:
        """Pack the chunks into flat Python lists, then into tensors: one host-to-device copy per dtype here
        and in the attention metadata."""
        input_ids: list[int] = []
        positions: list[int] = []
        logits_indices: list[int] = []
        for chunk in chunks:
            input_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start_pos, chunk.start_pos + len(chunk.token_ids)))
            logits_indices.extend(range(len(input_ids) - chunk.num_logits, len(input_ids)))
        attn = AttentionMetadata.build(
            context_lens=[c.start_pos for c in chunks],
            query_lens=[len(c.token_ids) for c in chunks],
            block_tables=[c.block_ids for c in chunks],
            block_size=self.block_size,
            device=self.device,
        )
        num_tokens = len(input_ids)
        packed = host_to_device(input_ids + positions + logits_indices, torch.int64, self.device)  # one copy
        return _StepInputs(
            input_ids=packed[:num_tokens],
            positions=packed[num_tokens : 2 * num_tokens],
            attn=attn,
            logits_indices=packed[2 * num_tokens :],
        )
