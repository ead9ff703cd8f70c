"""``--fake-model``: a model runner without a model, for measuring everything around the model.

It is a model executor as :class:`ModelRunner` is (``execute`` over a step's chunks, logits in chunk
order) but computes nothing: the logits after token ``t`` put :data:`FAKE_SUCCESSOR_LOGIT` on ``successor(t)`` and 0
on every other token, where the successor walks a cycle of :data:`FAKE_CYCLE` ordinary tokens. Greedy output
is that cycle, so n-gram prompt lookup hits once a cycle has been seen; sampling at temperature 1 keeps the
successor with probability ~0.85, so rejection sampling rejects some drafts. The vocabulary and tokenizer
are the built-in model's (:data:`FAKE_MODEL_CONFIG`); no KV memory is allocated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from openinfer.engine_core.config import check_kv_geometry
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.worker.executor import ForwardOutput
from openinfer.engine_core.worker.step_batch import StepBatch

# The built-in tokenizer's vocabulary; ids 0..2 are its special tokens (0 is EOS).
FAKE_MODEL_CONFIG = ModelConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=1,
    num_key_value_heads=1,
    head_dim=64,  # with 1 layer and 1 KV head: 8 KiB of (notional) KV cache per 16-token block in float32
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    attention_bias=False,
    eos_token_ids=(0,),
    torch_dtype=None,
)
FIRST_CYCLE_TOKEN = 3  # the first id after the special tokens
FAKE_CYCLE = 32  # tokens 3..34 follow each other, 34 is followed by 3; any other token is followed by 3
FAKE_SUCCESSOR_LOGIT = 8.0  # softmax at temperature 1: e^8 / (e^8 + 511) ~ 0.85 on the successor


def successors(token_ids: Tensor) -> Tensor:
    """The fake model's next token after each of ``token_ids`` (int64, any shape)."""
    offset = token_ids - FIRST_CYCLE_TOKEN
    in_cycle = (offset >= 0) & (offset < FAKE_CYCLE)
    following = FIRST_CYCLE_TOKEN + (offset + 1) % FAKE_CYCLE
    return torch.where(in_cycle, following, torch.full_like(token_ids, FIRST_CYCLE_TOKEN))


@dataclass(eq=False)
class FakeModelRunner:
    """A model executor whose ``execute`` is the fake model's rule: no weights, no KV cache.

    It checks every step, the engine's own too (which the real runner takes as they are), so scheduling and
    input-batch bugs surface in the fake-model tests.
    """

    model_path: Path  # unused: the fake model has no folder (the built-in tokenizer's serves its vocabulary)
    device: torch.device
    num_kv_blocks: int  # notional: block ids are checked against it, no memory is allocated
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    model_config: ModelConfig = field(default=FAKE_MODEL_CONFIG, init=False)
    state_geometry: StateGeometry | None = field(default=None, init=False)  # no state: not a hybrid model

    def __post_init__(self) -> None:
        check_kv_geometry(self.num_kv_blocks, self.block_size)
        self.device = torch.device(self.device)

    @torch.inference_mode()
    def warm_up(self, aux_layer_ids: Sequence[int] = ()) -> None:
        """Nothing to compile."""

    def execute(self, step: StepBatch, aux_layer_ids: Sequence[int] = ()) -> ForwardOutput:
        """(sum of num_logits, vocab_size) float32 logits, each chunk's last num_logits rows in order; no
        hidden states (a DFlash drafter needs a real model's: the engine refuses it with --fake-model first)."""
        if aux_layer_ids:
            raise ValueError(
                "--fake-model has no hidden states for a DFlash drafter; use --spec-method ngram"
            )
        step.check(self.model_config.max_position_embeddings, self.num_kv_blocks)
        last_ids = step.token_ids[step.logits_indices].tolist()
        tokens = torch.tensor(last_ids, dtype=torch.int64, device=self.device)  # (num_logits,)
        logits = torch.zeros(len(last_ids), self.model_config.vocab_size, device=self.device)
        logits[torch.arange(len(last_ids), device=self.device), successors(tokens)] = FAKE_SUCCESSOR_LOGIT
        return ForwardOutput(logits, None)
