"""Runs the target model over a step's chunks; owns the weights, the paged KV cache and the engine's kernel
choices."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from openinfer.engine_core.compilation_config import CompilationConfig
from openinfer.engine_core.config import ModelDtype, check_kv_geometry
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.engine_core.models.qwen3_5 import Qwen3_5ForCausalLM
from openinfer.engine_core.models.qwen3_moe import Qwen3MoeForCausalLM
from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.models.weights import check_fits_checkpoint
from openinfer.engine_core.worker.executor import ForwardOutput, reachable_positions, resolve_dtype
from openinfer.engine_core.worker.step_batch import SeqChunk, StepBatch, step_of_chunks
from openinfer.engine_core.worker.step_graphs import StepGraphs
from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.backend_name import BackendName
from openinfer.kernels.cpu_matmul import cpu_packing_available
from openinfer.kernels.host_copy import host_to_device_parts
from openinfer.kernels.kernel_backends import choose_kernel_backends
from openinfer.kernels.state_index import StateIndex

if (
    TYPE_CHECKING
):  # imported when a step is compiled: torch._dynamo (and triton, where installed) load with it
    from openinfer.engine_core.worker.compiled_forward import CompiledForward

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _StepInputs:
    input_ids: Tensor  # (num_tokens,) int64
    positions: Tensor  # (num_tokens,) int64
    attn: AttentionMetadata
    logits_indices: (
        Tensor | None
    )  # (sum of num_logits,) int64: the hidden rows to turn into logits; None: all


class ModelRunner:
    """Loads a Qwen3 or Qwen3.5 (dense or MoE) folder onto `device` and runs batched steps over a paged KV
    cache of `num_kv_blocks` blocks of `block_size` tokens (allocated zeroed, once, here, with one scratch
    block past them for padding), running the kernels `choose_kernel_backends` picks once for `device` and
    `attention_backend` (auto attention: Triton on CUDA, torch on the CPU), logged once; a Qwen3.5 model's
    Gated DeltaNet layers keep their state in the slots of `state_geometry` (its scratch slot the padded steps').

    Decode and verify steps (a hybrid model's of up to 16 tokens a request) run as padded fixed shapes from
    CUDA graphs on CUDA when the attention backend allows it, unless ``enforce_eager`` (see
    :mod:`step_graphs`); everything else runs eagerly.

    With ``parallel`` of several ranks (tensor parallelism: Qwen3 and Qwen3.5, dense or MoE, the MoE with or
    without expert parallelism) this runner is one rank's: it loads and runs the rank's
    shard of the model (qwen3.py, qwen3_moe.py, qwen3_5.py) and holds the KV cache of the rank's KV heads
    and a hybrid model's state slots of the rank's DeltaNet heads (the same `state_geometry` on every rank);
    every rank runs the same steps, and each returns the whole logits.
    """

    def __init__(
        self,
        model_path: Path,
        device: torch.device,
        num_kv_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype | None = None,
        attention_backend: BackendName = BackendName.AUTO,
        enforce_eager: bool = False,
        max_num_seqs: int = 256,
        state_geometry: StateGeometry | None = None,
        parallel: TensorParallel = TensorParallel.SINGLE,
        compilation: CompilationConfig | None = None,
    ) -> None:
        check_kv_geometry(num_kv_blocks, block_size)
        self.device = torch.device(device)
        if self.device.type == "cuda":  # Triton launches and graph capture use the current device
            torch.cuda.set_device(self.device.index or 0)
        self.dtype = dtype or resolve_dtype(ModelDtype.AUTO, self.device)
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.model_config = config = ModelConfig.from_folder(model_path)
        self.parallel = parallel
        # every kernel choice of this engine, made once here and handed to the layers (kernel_backends.py)
        self.kernels = choose_kernel_backends(self.device, attention_backend, block_size)
        self.attn_backend = self.kernels.attention
        logger.info(
            "kernels on %s, %s: %s",
            self.device,
            str(self.dtype).removeprefix("torch."),
            self.kernels.describe(),
        )
        # The model's RoPE table (and the padded steps) cover the positions a step can reach, not all of a
        # config's max_position_embeddings (2^31 of them asked for 16 GiB at the first step).
        positions = reachable_positions(config.max_position_embeddings, num_kv_blocks, block_size)
        reachable = replace(config, max_position_embeddings=positions)
        with torch.device("meta"):  # no throwaway random init; load_weights fills every parameter
            model = _model_class(config)(reachable, self.kernels)
        check_fits_checkpoint(model, Path(model_path))  # before config.json's sizes are allocated
        if not parallel.single:  # the rank's shard, once the whole model's sizes fit the checkpoint
            with torch.device("meta"):
                model = _model_class(config)(reachable, self.kernels, parallel=parallel)
        self.model = model.to(self.dtype).to_empty(device=self.device).eval()
        self.model.load_weights(Path(model_path))
        if self.device.type == "cpu" and cpu_packing_available(self.dtype):
            self.model.pack_for_cpu()
        # (KV layers, 2, num_blocks, block_size, KV heads, head_dim) in one allocation, a view per layer (a
        # hybrid model's full-attention layers only); KV heads: this rank's. Block num_kv_blocks is the
        # scratch block padded steps write into.
        kv_heads = parallel.kv_heads(config.num_key_value_heads).size
        cache_shape = (2, num_kv_blocks + 1, block_size, kv_heads, config.head_dim)
        caches = torch.zeros((config.num_kv_layers, *cache_shape), dtype=self.dtype, device=self.device)
        self.kv_caches: list[Tensor] = list(caches.unbind(0))
        logger.info(
            "%s: weights %.1f MiB, KV cache %.1f MiB",
            parallel.describe(),
            sum(p.nbytes for p in self.model.parameters()) / 2**20,
            caches.nbytes / 2**20,
        )
        # A hybrid model's state slots: a group per request it can hold, one slot per request by default.
        self.state_geometry: StateGeometry | None = None
        if isinstance(self.model, Qwen3_5ForCausalLM):
            self.state_geometry = state_geometry or StateGeometry(max_num_seqs, 1)
            self.model.allocate_states(self.state_geometry.num_slots, self.device)
        compilation = compilation or CompilationConfig()
        self.compiled = self._compile(compilation, enforce_eager)  # after packing: it reads the packed copies
        capture = self.device.type == "cuda" and not enforce_eager and self.attn_backend.cuda_graphs
        capture = capture and compilation.cuda_graphs
        if capture and not parallel.single:
            # the all-reduces inside a captured step have not run on a GPU yet: eager until they have
            logger.info("%s: CUDA graphs off under tensor parallelism (eager steps)", parallel.describe())
            capture = False
        self.step_graphs: StepGraphs | None = None
        buckets = compilation.capture_sizes(max_num_seqs)
        if capture and not buckets:
            logger.warning("no CUDA graph capture size is at most max_num_seqs %d: eager steps", max_num_seqs)
        if capture and buckets:
            self.step_graphs = StepGraphs(
                self.model, self.kv_caches, block_size, num_kv_blocks, positions,
                buckets, capture=True, state_geometry=self.state_geometry,
            )  # fmt: skip
        self.warm_up()  # a compiled runner's graphs, before the engine serves

    def _compile(self, compilation: CompilationConfig, enforce_eager: bool) -> CompiledForward | None:
        """The compiled stack when ``compilation`` asks for one (never under --enforce-eager, nor on a host
        that cannot compile: one warning, then eager)."""
        if not compilation.compiles or enforce_eager:
            return None
        if self.device.type != "cpu":  # the compiled graph under CUDA graphs has not run on a GPU yet
            logger.warning(
                "the model step runs eagerly on %s (with CUDA graphs): -O1..3 is CPU-only so far", self.device
            )
            return None
        from openinfer.engine_core.worker.compiled_forward import CompiledForward, compiler_missing

        missing = compiler_missing(self.device)
        if missing is not None:
            logger.warning("the model step runs eagerly, not compiled: %s", missing)
            return None
        mixers = self.model.linear_layers if isinstance(self.model, Qwen3_5ForCausalLM) else ()
        return CompiledForward(self.model, self.kernels, compilation, mixers)

    def warm_up(self, aux_layer_ids: Sequence[int] = ()) -> None:
        """A compiled runner compiles its one-token and its dynamic graph, and one per ``compile_sizes``
        (with ``aux_layer_ids``), now, over the scratch block and a hybrid model's scratch slot (what padding
        writes: nothing a request holds): the engine does this before it serves, since a step that compiles
        keeps it silent past the frontend's engine timeout."""
        if self.compiled is None:
            return
        slot = self.state_geometry.scratch_slot if self.state_geometry is not None else None
        for num_tokens in sorted({1, 2, *self.compiled.compile_sizes}):
            blocks = [self.num_kv_blocks] * -(-num_tokens // self.block_size)  # the scratch block, again
            chunk = SeqChunk([0] * num_tokens, 0, blocks, state_slot=slot)
            self.execute(step_of_chunks([chunk], self.block_size), aux_layer_ids)

    def embed(self, token_ids: Tensor) -> Tensor:
        """(...,) int64 token ids -> (..., hidden) input embeddings (a drafter shares them)."""
        return self.model.model.embed_tokens(token_ids)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden) final hidden states -> (n, vocab) float32 logits (a drafter shares the LM head)."""
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def execute(self, step: StepBatch, aux_layer_ids: Sequence[int] = ()) -> ForwardOutput:
        """Run every chunk's new tokens in one forward pass, writing their keys and values into the cache (the
        engine's steps come from its input batch as they are; tests check theirs, ``testing/seq_chunks.py``).

        Returns logits (sum of num_logits, vocab_size) float32: each chunk's logits for its last num_logits
        tokens, in chunk order; and with ``aux_layer_ids`` aux (num_tokens, len(aux_layer_ids) * hidden), the
        chosen layers' outputs concatenated in order, rows in chunk order (a drafter's context features).
        """
        output = self._forward(step, aux_layer_ids)
        if step.state_copies is not None:  # prefix states kept from group slots, after the forward wrote them
            assert isinstance(self.model, Qwen3_5ForCausalLM)
            copies = torch.from_numpy(step.state_copies).to(self.device)
            self.model.copy_states(copies[:, 0], copies[:, 1])
        return output

    def _forward(self, step: StepBatch, aux_layer_ids: Sequence[int]) -> ForwardOutput:
        padded = self.step_graphs.fits(step) if self.step_graphs is not None else None
        if self.step_graphs is not None and padded is not None:
            return ForwardOutput(*self.step_graphs.run(step, *padded, aux_layer_ids))
        inputs = self._prepare(step)
        aux: Tensor | None = None
        if self.compiled is not None:
            hidden, layers = self.compiled(
                inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn, aux_layer_ids
            )
            aux = torch.cat(layers, dim=-1) if aux_layer_ids else None
        elif aux_layer_ids:
            hidden, layers = self.model.forward_with_aux(
                inputs.input_ids,
                inputs.positions,
                self.kv_caches,
                inputs.attn,
                aux_layer_ids=list(aux_layer_ids),
            )
            aux = torch.cat(layers, dim=-1)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn)
        rows = hidden if inputs.logits_indices is None else hidden[inputs.logits_indices]
        return ForwardOutput(self.model.compute_logits(rows), aux)

    def _prepare(self, step: StepBatch) -> _StepInputs:
        """The step's input tensors: the int64 ones in one host-to-device copy, the attention metadata's
        int32 ones in another."""
        n = step.num_tokens
        every_row = step.logits_for_every_token
        num_logits = 0 if every_row else len(step.logits_indices)
        packed = np.empty(3 * n + num_logits, dtype=np.int64)
        packed[:n], packed[n : 2 * n], packed[2 * n : 3 * n] = (
            step.token_ids,
            step.positions,
            step.slot_mapping,
        )
        if not every_row:
            packed[3 * n :] = step.logits_indices
        input_ids, positions, slots, *logits_indices = host_to_device_parts(
            packed, [n, n, n] + ([] if every_row else [num_logits]), self.device
        )
        attn = AttentionMetadata.from_arrays(
            step.context_lens,
            step.query_lens,
            step.block_tables,
            slots,
            self.block_size,
            step.max_query_len,
            step.max_seq_len,
        )
        if self.state_geometry is not None:
            if step.state_read is None or step.state_write is None:
                raise ValueError(
                    "a hybrid model's step must name its state slots (StepBatch.state_read/write)"
                )
            states = StateIndex.build(
                step.query_start_loc.tolist(),
                step.state_read.tolist(),
                step.state_write.tolist(),
                self.device,
            )
            attn = replace(attn, states=states)
        return _StepInputs(input_ids, positions, attn, logits_indices[0] if logits_indices else None)


def _model_class(config: ModelConfig) -> type[Qwen3ForCausalLM]:
    """The model of a config: Qwen3.5 (hybrid, dense or MoE) by its layer_types, else Qwen3-MoE
    (model_type qwen3_moe) by its experts, else dense Qwen3."""
    if config.hybrid is not None:
        return Qwen3_5ForCausalLM
    return Qwen3ForCausalLM if config.moe is None else Qwen3MoeForCausalLM
