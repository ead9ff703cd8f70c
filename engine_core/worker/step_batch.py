"""One step's chunks as flat numpy arrays: gathered by the engine's input batch (``InputBatch.step_of``; tests
build them from chunks with ``testing/seq_chunks.py``), and read by the runners, the attention metadata and
the padded (CUDA-graph) steps alike."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

Int64s = NDArray[np.int64]


@dataclass(frozen=True)
class StepBatch:
    """B chunks, N tokens packed chunk after chunk. Every array is int64."""

    token_ids: Int64s  # (N,)
    positions: Int64s  # (N,): chunk b's tokens sit at context_lens[b], context_lens[b] + 1, ...
    slot_mapping: Int64s  # (N,): each token's KV-cache slot
    context_lens: Int64s  # (B,): tokens of the chunk's request already in the cache
    query_lens: Int64s  # (B,)
    num_logits: Int64s  # (B,): logits wanted for the chunk's last num_logits tokens
    block_tables: Int64s  # (B, W): W the longest table; columns past a table's length are padding
    num_blocks: Int64s  # (B,): the length of each chunk's table
    block_size: int
    max_query_len: int
    max_seq_len: int  # the longest context after the step
    logits_for_every_token: bool  # decode and verify steps: logits_indices is 0..N-1

    def check(self, max_positions: int, num_kv_blocks: int) -> None:
        """Refuse what a runner cannot run: logits a chunk lacks, positions past the model's, tables too short
        for their tokens, block ids out of range (empty chunks are refused where chunks become a step)."""
        if not self.logits_for_every_token and (
            self.num_logits.min() < 0 or (self.num_logits > self.query_lens).any()
        ):
            b = int(np.argmax((self.num_logits < 0) | (self.num_logits > self.query_lens)))
            raise ValueError(f"num_logits {self.num_logits[b]} is outside [0, {self.query_lens[b]}]")
        if self.max_seq_len > max_positions:
            raise ValueError(f"position {self.max_seq_len - 1} is past the model's {max_positions}")
        seq_lens = self.seq_lens
        short = self.num_blocks * self.block_size < seq_lens
        if short.any():
            b = int(np.argmax(short))
            raise ValueError(
                f"{self.num_blocks[b]} blocks of {self.block_size} cannot hold {seq_lens[b]} tokens"
            )
        # Columns past a table's length are padding or blocks it held before: valid ids either way.
        if self.block_tables.min() < 0 or self.block_tables.max() >= num_kv_blocks:
            used = self.block_tables[np.arange(self.block_tables.shape[1]) < self.num_blocks[:, None]]
            raise ValueError(f"block ids must be in [0, {num_kv_blocks}), got {sorted(set(used.tolist()))}")

    @property
    def num_chunks(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @cached_property
    def seq_lens(self) -> Int64s:
        """(B,): context length after the step, the chunk's tokens included."""
        return self.context_lens + self.query_lens

    @cached_property
    def query_start_loc(self) -> Int64s:
        """(B + 1,): chunk b's tokens are [loc[b], loc[b + 1])."""
        return np.concatenate(([0], np.cumsum(self.query_lens)))

    @cached_property
    def logits_indices(self) -> Int64s:
        """(sum of num_logits,): the token rows whose logits the step returns, chunk by chunk."""
        return expand_runs(self.query_start_loc[1:] - self.num_logits, self.num_logits)[1]


def expand_runs(starts: Int64s, lengths: Int64s) -> tuple[Int64s, Int64s]:
    """Runs of consecutive values, run b being starts[b], starts[b] + 1, ... (lengths[b] of them), laid end
    to end: (the run of each value, the values)."""
    run_of = np.repeat(np.arange(len(lengths)), lengths)
    first = np.cumsum(lengths) - lengths  # (B,): where each run begins in the output
    return run_of, starts[run_of] + np.arange(len(run_of)) - first[run_of]
