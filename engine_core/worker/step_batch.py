"""One step's chunks as flat numpy arrays: gathered by the engine's input batch (``InputBatch.step_of``; tests,
tools and the engine's step-cost profile build them from chunks, ``step_of_chunks``), and read by the
runners, the attention metadata and the padded (CUDA-graph) steps alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from openinfer.engine_core.models.config import ModelConfig

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
    # a hybrid model's state slots (StateGeometry): the slot each chunk starts from, -1 for zeros (position 0)
    # (B,); the slot each token's state is kept in, -1 for none (N,). None for models without state.
    state_read: Int64s | None = None
    state_write: Int64s | None = None
    # (M, 2): after the forward, slot [m, 1] takes slot [m, 0]'s state (a prefix state kept from a group slot)
    state_copies: Int64s | None = None

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


class ChunkRunner(Protocol):
    """What a step built from chunks is checked against (a model executor)."""

    block_size: int
    num_kv_blocks: int
    model_config: ModelConfig


@dataclass(frozen=True)
class SeqChunk:
    """One request's share of a step: the new tokens to run and where their KV entries go."""

    token_ids: list[int]  # new tokens to run this step for one request
    start_pos: int  # tokens of this request already in its KV cache (position of token_ids[0])
    block_ids: list[int]  # the request's block table, covering start_pos + len(token_ids) slots
    num_logits: int = 1  # logits wanted for the LAST num_logits tokens (0 for a mid-prompt prefill chunk)
    # a hybrid model's state slot of this request: read before its first token (unless start_pos is 0), and
    # where its last token's state is kept
    state_slot: int | None = None


def chunk_step(chunks: Sequence[SeqChunk], runner: ChunkRunner) -> StepBatch:
    """The step of ``chunks``, checked against what ``runner`` can run (the engine's own steps are not: its
    input batch holds what the KV manager allocated)."""
    step = step_of_chunks(chunks, runner.block_size)
    step.check(runner.model_config.max_position_embeddings, runner.num_kv_blocks)
    return step


def step_of_chunks(chunks: Sequence[SeqChunk], block_size: int) -> StepBatch:
    """The chunks as one step (in a few vectorised operations); refuses empty chunks and tables too short."""
    if not chunks:
        raise ValueError("execute needs at least one chunk")
    num = len(chunks)
    counts = np.array(
        [(len(c.token_ids), c.start_pos, c.num_logits, len(c.block_ids)) for c in chunks], dtype=np.int64
    ).reshape(num, 4)
    query_lens, context_lens, num_logits, num_blocks = counts.T
    num_tokens, total_blocks = int(query_lens.sum()), int(num_blocks.sum())
    token_ids = np.fromiter(chain.from_iterable(c.token_ids for c in chunks), np.int64, num_tokens)
    flat = np.fromiter(chain.from_iterable(c.block_ids for c in chunks), np.int64, total_blocks)
    width = max(int(num_blocks.max()), 1)
    tables = np.zeros((num, width), dtype=np.int64)
    tables[np.arange(width) < num_blocks[:, None]] = flat  # row-major order is chunk order
    chunk_of, positions = expand_runs(context_lens, query_lens)  # (N,) each: its chunk, its position
    if np.any(positions < 0) or np.any(query_lens < 1):
        bad = int(np.argmax((context_lens < 0) | (query_lens < 1)))
        raise ValueError(f"a chunk needs at least one token and start_pos >= 0, got {chunks[bad]}")
    block_index = positions // block_size
    covered = block_index < num_blocks[chunk_of]
    if not covered.all():
        bad = int(chunk_of[np.argmin(covered)])
        raise ValueError(
            f"{len(chunks[bad].block_ids)} blocks of {block_size} cannot hold "
            f"{chunks[bad].start_pos + len(chunks[bad].token_ids)} tokens"
        )
    slots = tables[chunk_of, block_index] * block_size + positions % block_size
    state_read = state_write = None
    if any(c.state_slot is not None for c in chunks):
        state = np.array([-1 if c.state_slot is None else c.state_slot for c in chunks], dtype=np.int64)
        state_read = np.where(context_lens > 0, state, -1)
        state_write = np.full(num_tokens, -1, dtype=np.int64)
        state_write[np.cumsum(query_lens) - 1] = state  # each chunk's last token
    return StepBatch(
        token_ids,
        positions,
        slots,
        context_lens,
        query_lens,
        num_logits,
        tables,
        num_blocks,
        block_size,
        max_query_len=int(query_lens.max()),
        max_seq_len=int((context_lens + query_lens).max()),
        logits_for_every_token=bool((num_logits == query_lens).all()),
        state_read=state_read,
        state_write=state_write,
    )
