"""The driver's unsharded copy of a tensor-parallel target's embedding and LM head, for a block drafter only
(DFlash, DSpark: they share the target's, ``spec_decode/drafter.py``'s ``DraftTarget``).

At N > 1 the target's embedding and LM head are vocab-parallel: a lookup or a head's matmul is a collective
every rank must join. The drafter runs on rank 0 alone, between steps the other ranks do not see, so rank 0
holds a whole copy of both matrices (one when tied) and the drafter's lookups and logits stay local. Its
numbers are the N = 1 runner's: the same checkpoint tensors at the same dtype, the same matmul (packed on the
CPU where the runner packs), float32 logits.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor, nn

from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.hybrid_config import text_weight_name
from openinfer.engine_core.models.packed_linear import pack_modules_for_cpu
from openinfer.engine_core.models.vocab_matrix import VocabMatrix
from openinfer.engine_core.models.weights import Target, checkpoint_names, load_checkpoint
from openinfer.kernels.cpu_matmul import cpu_packing_available

logger = logging.getLogger(__name__)
EMBEDDING = "model.embed_tokens.weight"  # the text model's names (a released Qwen3.5's, once renamed)
LM_HEAD = "lm_head.weight"


def draft_head_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes the copy of ``config``'s embedding (and untied LM head) takes at ``dtype`` (:attr:`DraftHead.nbytes`)."""
    return (1 if config.tie_word_embeddings else 2) * config.vocab_size * config.hidden_size * dtype.itemsize


class DraftHead(nn.Module):
    """A target's (vocab_size, hidden_size) embedding and, untied, its LM head, whole (``TensorParallel.SINGLE``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = VocabMatrix(config.vocab_size, config.hidden_size)
        # tied checkpoints have no lm_head.weight: the embedding serves as the head
        self.lm_head = (
            None if config.tie_word_embeddings else VocabMatrix(config.vocab_size, config.hidden_size)
        )

    @classmethod
    def load(cls, folder: Path, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> DraftHead:
        """The copy of ``folder``'s embedding and LM head on ``device`` at ``dtype``; no other tensor is read."""
        with torch.device("meta"):  # no throwaway random init; the checkpoint fills both
            head = cls(config)
        head = head.to(dtype).to_empty(device=device).eval()
        wanted: dict[str, Target] = {EMBEDDING: head.embed_tokens.checkpoint_target()}
        if head.lm_head is not None:
            wanted[LM_HEAD] = head.lm_head.checkpoint_target()
        # keyed by the checkpoint's names (a released Qwen3.5 holds model.language_model.embed_tokens.weight);
        # one it lacks keeps its own name, and the loader reports it missing
        names = checkpoint_names(folder)
        targets = {name: wanted[text] for name in names if (text := text_weight_name(name)) in wanted}
        present = {text_weight_name(name) for name in targets}
        targets.update((text, target) for text, target in wanted.items() if text not in present)
        load_checkpoint(folder, targets, unexpected_hint="", skip=lambda name: name not in targets)
        if device.type == "cpu" and cpu_packing_available(dtype):  # as the runner packs its head
            pack_modules_for_cpu(head)
        logger.info("rank 0: drafter's embedding/LM head copy %.1f MiB", head.nbytes / 2**20)
        return head

    @property
    def nbytes(self) -> int:
        """Bytes of the matrices as held (a CPU-packed copy of the head aside)."""
        return sum(p.nbytes for p in self.parameters())

    def embed(self, token_ids: Tensor) -> Tensor:
        """(...,) int64 token ids -> (..., hidden) the target's input embeddings."""
        return self.embed_tokens(token_ids)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden) final hidden states -> (n, vocab) float32 logits through the target's LM head."""
        head = self.lm_head if self.lm_head is not None else self.embed_tokens
        return head.logits(hidden).float()
