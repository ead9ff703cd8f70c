"""A checkpoint's (vocab_size, hidden_size) matrix, the token embedding or the LM head (one matrix for both
when they are tied), stored transposed for the LM head's matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from openinfer.kernels.cpu_matmul import pack_weight, weight_matmul


class VocabMatrix(nn.Module):
    """The checkpoint's (vocab_size, hidden_size) matrix, held as ``weight_t`` (hidden_size, vocab_size).

    On the CPU, MKL multiplies a decode step's few rows by a row-major (hidden, vocab) matrix at the memory
    bandwidth, but by the (vocab, hidden) layout ``F.linear`` hands it 1.7x slower at 1 row and 2x at 8
    (issue 23's profile: the LM head is ~85 % of a 2-layer Qwen3-0.6B step's bytes). ``weight`` is the view
    in the checkpoint's shape (loading writes through it). As an embedding, a token's row is a column of
    ``weight_t``: a strided read of hidden_size values, a few µs per token. On the CPU, `pack_for_cpu` may
    give the head a oneDNN-packed copy (kernels/cpu_matmul.py) for 2+ rows: 2x faster at 8 rows.
    """

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight_t = nn.Parameter(torch.empty(hidden_size, vocab_size))
        self.packed: Tensor | None = None  # (vocab, hidden) packed by oneDNN for 2+ rows of `logits`, or None

    @property
    def weight(self) -> Tensor:
        """(vocab_size, hidden_size), a view of ``weight_t``."""
        return self.weight_t.t()

    def forward(self, token_ids: Tensor) -> Tensor:
        """(...,) int64 token ids -> (..., hidden_size) embeddings."""
        return F.embedding(token_ids, self.weight)

    def logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden_size) -> (n, vocab_size) in the matrix's dtype: hidden @ weight.T."""
        return weight_matmul(hidden, self.weight_t, self.packed)

    def pack_for_cpu(self) -> None:
        """From now on compute `logits` of 2+ rows by a oneDNN-packed copy of the (loaded) matrix."""
        self.packed = pack_weight(self.weight)
