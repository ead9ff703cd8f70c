"""A checkpoint's (vocab_size, hidden_size) matrix, the token embedding or the LM head (one matrix for both
when they are tied), stored transposed for the LM head's matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.models.weights import CheckpointSlice, Target
from openinfer.kernels.cpu_matmul import PackedWeight, pack_weight, weight_matmul


class VocabMatrix(nn.Module):
    """The checkpoint's (vocab_size, hidden_size) matrix, held as ``weight_t`` (hidden_size, vocab_size).

    On the CPU, MKL multiplies a decode step's few rows by a row-major (hidden, vocab) matrix at the memory
    bandwidth, but by the (vocab, hidden) layout ``F.linear`` hands it 1.7x slower at 1 row and 2x at 8
    (issue 23's profile: the LM head is ~85 % of a 2-layer Qwen3-0.6B step's bytes). ``weight`` is the view
    in the checkpoint's shape (loading writes through it). As an embedding, a token's row is a column of
    ``weight_t``: a strided read of hidden_size values, a few µs per token. On the CPU, `pack_for_cpu` may
    give the head a oneDNN-packed copy (kernels/cpu_matmul.py): 2x faster at 8 rows, and on some CPUs at 1.

    Vocab-parallel (``parallel`` of several ranks), each rank holds its slice ``rows`` of the vocabulary:
    a lookup reads the rank's own ids (the others' rows are zero) and sums over the ranks; `logits` computes
    the rank's columns and gathers every rank's, so each rank returns the whole (n, vocab_size).
    """

    def __init__(
        self, vocab_size: int, hidden_size: int, parallel: TensorParallel = TensorParallel.SINGLE
    ) -> None:
        super().__init__()
        self.parallel = parallel
        self.rows = parallel.shard_range(vocab_size, "vocabulary rows (vocab_size)")
        self.weight_t = nn.Parameter(torch.empty(hidden_size, self.rows.size))
        self.packed: PackedWeight | None = None  # (rows, hidden) packed by oneDNN for `logits`, or None

    @property
    def weight(self) -> Tensor:
        """(rows, hidden_size), a view of ``weight_t`` (rows: vocab_size at one rank)."""
        return self.weight_t.t()

    def checkpoint_target(self) -> Target:
        """Where the checkpoint's (vocab_size, hidden_size) matrix goes: ``weight``, or this rank's rows."""
        if self.rows.whole:
            return self.weight
        full_shape = (self.rows.total, self.weight_t.shape[0])
        return CheckpointSlice(self.weight, full_shape, (self.rows.slice,))

    def forward(self, token_ids: Tensor) -> Tensor:
        """(...,) int64 token ids -> (..., hidden_size) embeddings."""
        if self.parallel.single:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.rows.start
        outside = (local < 0) | (local >= self.rows.size)  # another rank's ids
        embedded = F.embedding(local.masked_fill(outside, 0), self.weight)  # (..., hidden_size)
        return self.parallel.all_reduce(embedded.masked_fill_(outside.unsqueeze(-1), 0.0))

    def logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden_size) -> (n, vocab_size) in the matrix's dtype: hidden @ weight.T (every rank's
        columns gathered, in rank order, when vocab-parallel)."""
        return self.parallel.all_gather_last(weight_matmul(hidden, self.weight_t, self.packed))

    def pack_for_cpu(self) -> None:
        """From now on compute `logits` by a oneDNN-packed copy of the (loaded) matrix (for the row counts
        `PackedWeight.min_rows` says)."""
        self.packed = pack_weight(self.weight)
