"""The model executor the engine core steps: one protocol, two runners (the real one and --fake-model's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from openinfer.engine_core.config import ModelDtype
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.kv_geometry import StateGeometry

if TYPE_CHECKING:
    from openinfer.engine_core.worker.step_batch import StepBatch


@dataclass(frozen=True)
class ForwardOutput:
    """What one forward pass gives: logits at the rows the step asked for and, when asked, hidden states."""

    logits: Tensor  # (sum of num_logits, vocab_size) float32: each chunk's last num_logits rows, chunk order
    aux: (
        Tensor | None
    )  # (num_tokens, len(aux_layer_ids) * hidden) at every token, chunk order; None: not asked


class ModelExecutor(Protocol):
    """What the engine core and its drafters need of a model runner.

    ``ModelRunner`` runs the Qwen3 target over the paged KV cache; ``testing.FakeModelRunner`` computes
    cheap deterministic logits for ``--fake-model``. The engine process chooses one and hands it to
    ``EngineCore(config, runner)``.
    """

    device: torch.device
    dtype: torch.dtype
    block_size: int  # tokens per KV block
    num_kv_blocks: int  # KV blocks the runner holds (block ids are in [0, num_kv_blocks))
    model_config: ModelConfig  # the target's architecture (vocabulary, EOS ids, max positions)
    state_geometry: StateGeometry | None  # a hybrid model's state slots; None for a model without state

    def execute(self, step: StepBatch, aux_layer_ids: Sequence[int] = ()) -> ForwardOutput:
        """Run the step: its logits and, when ``aux_layer_ids`` names decoder layers, their outputs
        concatenated in that order at every token (a drafter's context features)."""
        ...

    def warm_up(self, aux_layer_ids: Sequence[int] = ()) -> None:
        """Compile now whatever the first steps (with these aux layers) would compile, so that no request's
        step waits for it (a runner that compiles nothing does nothing)."""
        ...


def reachable_positions(max_position_embeddings: int, num_kv_blocks: int, block_size: int) -> int:
    """How many positions a step of an engine can reach: the model's, or fewer when its KV cache holds fewer
    tokens (a request that could outgrow the cache is refused: request_checks.py). Tables and rows sized by
    positions use it: a config's max_position_embeddings can be far more than a request here can reach."""
    return min(max_position_embeddings, num_kv_blocks * block_size)


def resolve_dtype(dtype: ModelDtype, device: torch.device) -> torch.dtype:
    """``--dtype`` on ``device``: auto is float32 on the CPU (exact parity with transformers) and bfloat16
    on CUDA."""
    if dtype is ModelDtype.AUTO:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return _TORCH_DTYPES[dtype]


_TORCH_DTYPES = {
    ModelDtype.FLOAT32: torch.float32,
    ModelDtype.BFLOAT16: torch.bfloat16,
    ModelDtype.FLOAT16: torch.float16,
}
