"""Steps built from per-request chunks, for tests, tools and benchmarks that run a model runner directly; and
the decision of a decode step, for benchmarks that gather it the way the engine does (``InputBatch``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from openinfer.engine_core.core.request import Request
from openinfer.engine_core.core.scheduler_output import ScheduledRequest
from openinfer.engine_core.worker.executor import ModelExecutor
from openinfer.engine_core.worker.step_batch import StepBatch, expand_runs
from openinfer.protocol import SamplingParams


@dataclass(frozen=True)
class SeqChunk:
    """One request's share of a step: the new tokens to run and where their KV entries go."""

    token_ids: list[int]  # new tokens to run this step for one request
    start_pos: int  # tokens of this request already in its KV cache (position of token_ids[0])
    block_ids: list[int]  # the request's block table, covering start_pos + len(token_ids) slots
    num_logits: int = 1  # logits wanted for the LAST num_logits tokens (0 for a mid-prompt prefill chunk)


def chunk_step(chunks: Sequence[SeqChunk], runner: ModelExecutor) -> StepBatch:
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
    )


def decoding_requests(prompts: list[list[int]], tables: list[list[int]]) -> list[ScheduledRequest]:
    """A decode step as the scheduler decides it: request b holds ``prompts[b]`` with all but its last token
    computed into the blocks ``tables[b]``, and runs that token."""
    scheduled = []
    for b, (prompt, table) in enumerate(zip(prompts, tables, strict=True)):
        request = Request(f"r{b}", list(prompt), SamplingParams(max_tokens=1), 0.0, len(prompt) + 1)
        request.block_ids = list(table)
        request.num_computed_tokens = len(prompt) - 1
        scheduled.append(ScheduledRequest.of(request, 1))
    return scheduled
