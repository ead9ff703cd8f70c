"""A tensor-parallel rank's job for a hybrid (Qwen3.5) model, run by `tensor_parallel_ranks.run_ranks`: a
`ModelRunner` with state slots runs prepared steps (their state reads, writes and copies included) and sends
back each step's logits and, after the last, every Gated DeltaNet layer's states (the rank's heads)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.models.qwen3_5 import Qwen3_5ForCausalLM
from openinfer.engine_core.models.tensor_parallel import Shard, TensorParallel
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.step_batch import StepBatch


@dataclass(frozen=True)
class LayerStates:
    """One DeltaNet layer's states on one rank, and which of the model's heads they hold."""

    conv: np.ndarray  # (num_slots, the rank's q/k/v channels, kernel - 1)
    recurrent: np.ndarray  # (num_slots, the rank's value heads, key dim, value dim) float32
    k_heads: Shard  # the rank's key heads (q and k channels: these heads' columns)
    v_heads: Shard  # the rank's value heads


@dataclass(frozen=True)
class HybridRankOutput:
    logits: list[np.ndarray]  # per step: (sum of num_logits, vocab) float32
    states: list[LayerStates]  # per DeltaNet layer, in layer order, after the last step


def hybrid_runner_outputs(
    parallel: TensorParallel,
    folder: Path,
    steps: Sequence[StepBatch],
    num_kv_blocks: int,
    block_size: int,
    states: StateGeometry,
    expert_parallel: bool = False,
) -> HybridRankOutput:
    """A rank's job: a float32 CPU `ModelRunner` of ``folder`` with the slots of ``states`` runs ``steps`` in
    order; their logits and the DeltaNet layers' states at the end. ``expert_parallel``: a MoE model's
    experts split whole over the ranks (--enable-expert-parallel)."""
    runner = ModelRunner(
        folder, torch.device("cpu"), num_kv_blocks, block_size, dtype=torch.float32,
        state_geometry=states, parallel=replace(parallel, expert_parallel=expert_parallel),
    )  # fmt: skip
    logits = [runner.execute(step).logits.numpy() for step in steps]
    assert isinstance(runner.model, Qwen3_5ForCausalLM)
    layers = []
    for layer in runner.model.linear_layers:
        assert layer.conv_state is not None and layer.recurrent_state is not None
        layers.append(
            LayerStates(layer.conv_state.numpy(), layer.recurrent_state.numpy(), layer.k_heads, layer.v_heads)
        )
    return HybridRankOutput(logits, layers)
