"""How many KV blocks an engine allocates.

``--num-kv-blocks`` if given, else what ``--kv-cache-gb`` buys, else on CUDA what ``--gpu-memory-utilization``
leaves (vLLM's rule: the engine may use that fraction of the GPU's total memory; the KV cache gets what the
weights, the activations and a fixed reserve leave of it), else, on the CPU, 1 GiB.

vLLM measures the weights and profiles a forward pass; openinfer counts instead, before anything is loaded:
the weights are the checkpoints' tensors (target and start-time drafter) at the engine's dtype, and the
activations a bound on one step's peak (below). Both are logged at start.

A block is one page of every layer's keys and values: the target's and, with a start-time DFlash or DSpark
drafter, the drafter's context cache, which holds the same pages (vLLM, likewise, sizes the KV cache over the
draft model's layers too). The budget buys whole blocks of both. The drafter's config is checked against the
target first, as a run-time load checks it (``block_drafter_config``): one that does not fit is refused
before anything is sized from it.

A hybrid model (Qwen3.5) keeps a KV page for its full-attention layers only, and a state group per running
request for its Gated DeltaNet layers (`StateGeometry`: 1 + K slots, each the conv and the float32 recurrent
state of every DeltaNet layer). The groups come out of the same budget first: one per --max-num-seqs, or as
many as half the budget holds when that is fewer (logged: the engine then runs at most that many requests at
once); the blocks get the rest.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from openinfer.engine_core.config import CHECKPOINT_METHODS, DEFAULT_CPU_KV_CACHE_GB, EngineConfig
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.kv_geometry import StateGeometry, page_bytes
from openinfer.engine_core.models.tensor_parallel import kv_heads_per_rank
from openinfer.engine_core.models.weights import checkpoint_shapes
from openinfer.engine_core.spec_decode.drafter_loaders import block_drafter_config
from openinfer.engine_core.worker.parallel.draft_head import draft_head_bytes

logger = logging.getLogger("openinfer.engine")

GIB = 2**30
CUDA_RESERVE_BYTES = GIB  # CUDA graphs' memory pool, cuBLAS and Triton workspaces, allocator slack


@dataclass(frozen=True)
class GpuMemory:
    """``torch.cuda.mem_get_info`` at engine start, after the CUDA context exists."""

    free: int  # bytes free on the device now (others' use and this process's context already taken)
    total: int  # bytes on the device


@dataclass(frozen=True)
class CudaKvBudget:
    """The arithmetic behind a ``--gpu-memory-utilization`` KV cache, in bytes."""

    requested: int  # utilization x total: what this engine may use in all
    weights: int  # the checkpoints' tensors at the engine's dtype
    activations: int  # a bound on one step's peak
    reserve: int = CUDA_RESERVE_BYTES

    @property
    def kv_bytes(self) -> int:
        return self.requested - self.weights - self.activations - self.reserve

    def describe(self) -> str:
        kv, requested, weights, activations, reserve = (
            n / GIB for n in (self.kv_bytes, self.requested, self.weights, self.activations, self.reserve)
        )
        return (
            f"KV cache {kv:.2f} GiB = {requested:.2f} GiB allowed - weights {weights:.2f} - activations "
            f"{activations:.2f} - reserve {reserve:.2f}"
        )


def cuda_kv_budget(memory: GpuMemory, utilization: float, weights: int, activations: int) -> CudaKvBudget:
    """The KV bytes ``utilization`` of this GPU leaves; ValueError saying what to change when the GPU lacks
    that much free memory (as vLLM: other processes' memory is not taken from the share, it must be free)
    or when nothing is left for the KV cache."""
    budget = CudaKvBudget(int(utilization * memory.total), weights, activations)
    if memory.free < budget.requested:
        raise ValueError(
            f"--gpu-memory-utilization {utilization:g} asks for {budget.requested / GIB:.2f} GiB of this GPU's "
            f"{memory.total / GIB:.2f} GiB, but only {memory.free / GIB:.2f} GiB are free: lower it, free the "
            "GPU, or give --kv-cache-gb"
        )
    if budget.kv_bytes <= 0:
        raise ValueError(
            f"--gpu-memory-utilization {utilization:g} leaves no KV cache ({budget.describe()}): raise it, "
            "lower --max-num-batched-tokens or --max-num-seqs, or give --kv-cache-gb"
        )
    return budget


def activation_bytes(
    model: ModelConfig,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    num_spec_tokens: int,
    dtype: torch.dtype,
) -> int:
    """A bound on one step's activations: every token of a full step holding one layer's widest tensors at
    once (the residual, its normed copy and the layer's output; q, k, v; the MLP's gate, up and product),
    plus three float32 vocabulary-wide rows (logits, probabilities, sampling scratch) for each token that
    samples (at most max_num_seqs x (K + 1), never more than the step's tokens)."""
    kv_width = model.num_key_value_heads * model.head_dim
    per_token = 3 * model.hidden_size + model.q_width + 2 * kv_width + 3 * model.intermediate_size
    sampled = min(max_num_batched_tokens, max_num_seqs * (num_spec_tokens + 1))
    return max_num_batched_tokens * per_token * dtype.itemsize + 3 * sampled * model.vocab_size * 4


def checkpoint_bytes(folder: Path, dtype: torch.dtype) -> int:
    """Bytes the tensors of ``folder``'s safetensors files take at ``dtype`` (read from their headers)."""
    return sum(math.prod(shape) for shape in checkpoint_shapes(folder).values()) * dtype.itemsize


def drafter_checkpoint(config: EngineConfig) -> Path | None:
    """The start-time drafter's checkpoint folder (DFlash or DSpark), whose weights and context cache share
    the budget; None without one."""
    spec = config.speculative
    if spec is None or spec.method not in CHECKPOINT_METHODS:
        return None
    return spec.draft_model


def kv_block_bytes(config: EngineConfig, model: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes one KV block takes on each rank: the target's page (over a tensor-parallel rank's KV heads) and
    the start-time DFlash or DSpark drafter's, once its config is checked against ``model`` (ValueError
    saying what does not fit). Each rank's KV budget buys the same number of blocks."""
    kv_heads = kv_heads_per_rank(model.num_key_value_heads, config.tensor_parallel_size)
    block = page_bytes(model, config.block_size, dtype, kv_heads)
    spec = config.speculative
    if spec is not None and spec.method in CHECKPOINT_METHODS:
        block += page_bytes(block_drafter_config(spec, model).layers, config.block_size, dtype)
    return block


def state_slot_bytes(model: ModelConfig, dtype: torch.dtype, tensor_parallel_size: int = 1) -> int:
    """Bytes one state slot takes on each rank across a hybrid model's DeltaNet layers: the conv state
    (kernel - 1 rows of the rank's q/k/v channels at ``dtype``) and the float32 recurrent state (the rank's
    value heads x key dim x value dim: the heads split over the ranks); 0 for Qwen3."""
    hybrid = model.hybrid
    if hybrid is None:
        return 0
    conv = hybrid.conv_dim // tensor_parallel_size * (hybrid.linear_conv_kernel_dim - 1) * dtype.itemsize
    value_heads = hybrid.linear_num_value_heads // tensor_parallel_size
    recurrent = value_heads * hybrid.linear_key_head_dim * hybrid.linear_value_head_dim * 4
    return len(hybrid.linear_layers) * (conv + recurrent)


def state_geometry(
    config: EngineConfig, model: ModelConfig, dtype: torch.dtype, gpu: GpuMemory | None
) -> StateGeometry | None:
    """A hybrid model's state groups and, with prefix caching, its prefix state slots (one per group) and
    their interval (see the module's docstring); None for a model without state. With --num-kv-blocks the
    groups are one per --max-num-seqs, beside the blocks."""
    if model.hybrid is None:
        return None
    spec = config.speculative
    size = 1 + (spec.num_spec_tokens if spec is not None else 0)
    slot = state_slot_bytes(model, dtype, config.tensor_parallel_size)
    per_group = (size + config.enable_prefix_caching) * slot  # its slots and, caching, one prefix slot
    budget = _cache_budget(config, model, dtype, gpu)
    groups = config.max_num_seqs
    if budget is not None and (budget // 2 - slot) // per_group < groups:
        groups = (budget // 2 - slot) // per_group
        logger.info(
            "hybrid model: %d state groups of %d slots (%.1f MiB each) take half the cache budget: at most %d "
            "requests run at once (--max-num-seqs %d)",
            groups, size, per_group / 2**20, groups, config.max_num_seqs,
        )  # fmt: skip
    geometry = StateGeometry(groups, size)
    if config.enable_prefix_caching:
        interval = prefix_interval(model, config.block_size, dtype, config.tensor_parallel_size)
        geometry = StateGeometry(groups, size, groups, interval)
    logger.info(
        "hybrid model: %d state groups of %d slot(s) and %d prefix state slots (every %d tokens), %.1f MiB of "
        "states (%.2f MiB a slot)",
        groups, size, geometry.num_prefix_slots, geometry.prefix_interval, geometry.num_slots * slot / 2**20,
        slot / 2**20,
    )  # fmt: skip
    return geometry


def prefix_interval(
    model: ModelConfig, block_size: int, dtype: torch.dtype, tensor_parallel_size: int = 1
) -> int:
    """Tokens between two positions whose state a hybrid model's prefix cache keeps: the fewest whole blocks
    whose KV pages take at least one state's bytes (both a rank's), so that a kept state costs no more than the
    tokens it serves (vLLM likewise sizes a hybrid model's blocks to its state)."""
    kv_heads = kv_heads_per_rank(model.num_key_value_heads, tensor_parallel_size)
    state = state_slot_bytes(model, dtype, tensor_parallel_size)
    pages = -(-state // page_bytes(model, block_size, dtype, kv_heads))
    return block_size * max(1, pages)


def _cache_budget(
    config: EngineConfig, model: ModelConfig, dtype: torch.dtype, gpu: GpuMemory | None
) -> int | None:
    """The bytes the KV blocks and a hybrid model's states share; None when --num-kv-blocks fixes the blocks."""
    if config.num_kv_blocks is not None:
        return None
    if config.kv_cache_gb is not None or gpu is None:
        gib = config.kv_cache_gb if config.kv_cache_gb is not None else DEFAULT_CPU_KV_CACHE_GB
        return int(gib * GIB)
    return _cuda_budget(config, model, dtype, gpu).kv_bytes


def _cuda_budget(
    config: EngineConfig, model: ModelConfig, dtype: torch.dtype, gpu: GpuMemory
) -> CudaKvBudget:
    # a rank's share of the target (its slices; the few replicated norms aside), and the drafter whole (it runs
    # on rank 0, the rank this budget sizes for) with, at N > 1, rank 0's whole copy of the target's embedding
    # and LM head that it drafts through (worker/parallel/draft_head.py)
    weights = checkpoint_bytes(config.model_path, dtype) // config.tensor_parallel_size
    drafter = drafter_checkpoint(config)
    if drafter is not None:
        weights += checkpoint_bytes(drafter, dtype)
        if config.tensor_parallel_size > 1:
            weights += draft_head_bytes(model, dtype)
    spec = config.speculative
    k = spec.num_spec_tokens if spec is not None else 0
    activations = activation_bytes(model, config.max_num_batched_tokens, config.max_num_seqs, k, dtype)
    return cuda_kv_budget(gpu, config.gpu_memory_utilization, weights, activations)


def num_kv_blocks(
    config: EngineConfig,
    model: ModelConfig,
    dtype: torch.dtype,
    block_bytes: int,
    gpu: GpuMemory | None,
    states: StateGeometry | None = None,
) -> int:
    """The engine's KV block count (see the module's docstring): ``block_bytes`` is one block's bytes, the
    target's and the drafter's pages together; ``gpu`` is None on the CPU; ``states``, a hybrid model's
    state slots, are taken from the budget first."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    slot = state_slot_bytes(model, dtype, config.tensor_parallel_size)
    state_bytes = 0 if states is None else states.num_slots * slot
    if config.kv_cache_gb is not None or gpu is None:
        budget = _cache_budget(config, model, dtype, gpu)
        assert budget is not None
        return int((budget - state_bytes) // block_bytes)
    cuda = _cuda_budget(config, model, dtype, gpu)
    blocks = (cuda.kv_bytes - state_bytes) // block_bytes
    logger.info(
        "%s (--gpu-memory-utilization %g): %d blocks of %d KiB (a drafter's context-cache pages included)%s",
        cuda.describe(), config.gpu_memory_utilization, blocks, block_bytes // 1024,
        "" if states is None else f", after {state_bytes / GIB:.2f} GiB of state slots",
    )  # fmt: skip
    return blocks
