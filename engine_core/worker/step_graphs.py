"""Decode and verify steps as fixed shapes: padded, then replayed from CUDA graphs (captured on first use).

A step is *uniform* when every chunk runs q <= MAX_QUERY_LEN tokens and wants logits for all of them (a
decode, q = 1, or a verification of drafts, q = K + 1). Such a step is padded to a bucket of B requests of q
tokens each: a request with fewer tokens gets padding tokens after its own (causal attention hides them from
its real ones), and padding requests run q tokens over the scratch block. Padding tokens write their keys
and values into the scratch block (one block past the KV manager's, never handed to a request), so nothing a
real request reads is touched, and their outputs are dropped.

On CUDA each (bucket, q, aux layers) shape is captured once into a graph over static input buffers; a replay
copies the step's inputs into the buffers (one pinned non-blocking copy per buffer) and launches the whole
forward at once.
The LM head runs eagerly on the real rows only. Prefill chunks and steps larger than the largest bucket run
eagerly as they are. ``StepGraphs(..., capture=False)`` runs the same padded step eagerly (the CPU path of the
tests: padding must not change a token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.engine_core.worker.step_batch import Int64s, StepBatch
from openinfer.kernels.attention import AttentionMetadata, host_to_device
from openinfer.protocol import MAX_SPEC_TOKENS

MAX_QUERY_LEN = MAX_SPEC_TOKENS + 1  # the longest verification: K drafts and the current token
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
QUERY_BUCKETS = (1, 2, 4, 8, 16, MAX_QUERY_LEN)  # q is padded up to one of these: few shapes to capture


@dataclass(frozen=True)
class PaddedStep:
    """A uniform step padded to ``batch`` requests of ``query_len`` tokens (int64 arrays, ready to copy)."""

    batch: int
    query_len: int
    input_ids: Int64s  # (batch, query_len)
    positions: Int64s  # (batch, query_len)
    slot_mapping: Int64s  # (batch, query_len)
    seq_lens: Int64s  # (batch,)
    block_tables: Int64s  # (batch, width)
    logits_rows: Int64s  # rows of the padded hidden states whose logits the step returns, in order

    @property
    def num_tokens(self) -> int:
        return self.batch * self.query_len


def uniform_query_len(step: StepBatch) -> int | None:
    """q, the query bucket of the longest chunk, when every chunk is a decode or verification (logits for all
    its tokens, at most MAX_QUERY_LEN)."""
    if step.max_query_len > MAX_QUERY_LEN or not step.logits_for_every_token:
        return None
    return next(q for q in QUERY_BUCKETS if step.max_query_len <= q)


def bucket_for(num_reqs: int, max_batch: int) -> int | None:
    """The smallest batch bucket holding ``num_reqs`` requests, or None past ``max_batch``."""
    return next((b for b in BATCH_BUCKETS if num_reqs <= b <= max_batch), None)


def pad_step(step: StepBatch, batch: int, query_len: int, scratch_block: int) -> PaddedStep:
    """Pad ``step`` to ``batch`` requests of ``query_len`` tokens; block tables to the columns this step reads
    (the kernels never read a column past a request's seq_len; the buffer's later ones stay stale)."""
    block_size, real, q = step.block_size, step.num_chunks, query_len
    scratch_slot = scratch_block * block_size
    column = np.arange(q)
    valid = column[None, :] < step.query_lens[:, None]  # (real, q): the chunks' own tokens
    starts = step.context_lens[:, None]
    input_ids = np.zeros((batch, q), dtype=np.int64)
    input_ids[:real][valid] = step.token_ids
    # Padding requests run q tokens over the scratch block from position 0; a chunk's padding tokens sit at
    # its first position (any valid RoPE position) and write the scratch slot.
    positions = np.tile(column, (batch, 1))
    positions[:real] = np.where(valid, starts + column, starts)
    slots = scratch_slot + positions % block_size
    slots[:real] = scratch_slot
    slots[:real][valid] = step.slot_mapping
    seq_lens = np.full(batch, q, dtype=np.int64)
    seq_lens[:real] = step.context_lens + q  # the padding tokens come last: real queries never see them
    width = int(-(-seq_lens[:real].max() // block_size))
    tables = np.full((batch, width), scratch_block, dtype=np.int64)
    tables[:real] = 0  # a table may hold more blocks than this step reads, or fewer than its padding
    shared = min(width, step.block_tables.shape[1])
    tables[:real, :shared] = step.block_tables[:, :shared]
    rows = (np.arange(real)[:, None] * q + column)[valid]
    return PaddedStep(batch, q, input_ids, positions, slots, seq_lens, tables, rows)


class StepGraphs:
    """Uniform steps of one model over its KV caches, padded to buckets and (on CUDA) replayed from graphs."""

    def __init__(
        self,
        model: Qwen3ForCausalLM,
        kv_caches: list[Tensor],
        block_size: int,
        scratch_block: int,
        max_model_len: int,
        max_batch: int,
        capture: bool,
    ) -> None:
        self.model, self.kv_caches, self.device = model, kv_caches, kv_caches[0].device
        self.block_size, self.scratch_block = block_size, scratch_block
        self.max_batch = max(b for b in BATCH_BUCKETS if b <= max(max_batch, 1))
        self.width = -(-(max_model_len + MAX_QUERY_LEN) // block_size)  # block-table columns
        self.capture = capture  # False: the padded step runs eagerly (the CPU tests' path)
        self._graphs: dict[tuple[int, int, tuple[int, ...]], _Graph] = {}
        self.num_runs = 0  # padded steps run (graph replays when capturing)
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._warmup_stream = torch.cuda.Stream() if capture else None
        max_tokens = self.max_batch * MAX_QUERY_LEN
        # Static inputs: every replay reads these; a copy of the step's values refreshes them.
        self._tokens = torch.zeros((3, max_tokens), dtype=torch.int64, device=self.device)  # ids, pos, slots
        self._seq_lens = torch.ones(self.max_batch, dtype=torch.int32, device=self.device)
        self._tables = torch.full(
            (self.max_batch, self.width), scratch_block, dtype=torch.int32, device=self.device
        )
        self._query_start = torch.zeros(self.max_batch + 1, dtype=torch.int32, device=self.device)

    def fits(self, step: StepBatch) -> tuple[int, int] | None:
        """(bucket, q) when this step can run padded, else None (run it eagerly as it is)."""
        query_len = uniform_query_len(step)
        batch = bucket_for(step.num_chunks, self.max_batch)
        if query_len is None or batch is None:
            return None
        return batch, query_len

    def run(
        self, chunks: StepBatch, batch: int, query_len: int, aux_layer_ids: Sequence[int] = ()
    ) -> tuple[Tensor, Tensor | None]:
        """Logits of the chunks' tokens (chunk order) and, with ``aux_layer_ids``, their aux hidden states."""
        step = pad_step(chunks, batch, query_len, self.scratch_block)
        self._load(step)
        self.num_runs += 1
        key = (batch, query_len, tuple(aux_layer_ids))
        if self.capture:
            graph = self._graphs.get(key)
            if graph is None:
                graph = self._graphs[key] = self._capture(batch, query_len, tuple(aux_layer_ids))
            graph.graph.replay()
            hidden, aux = graph.hidden, graph.aux
        else:
            hidden, aux = self._forward(batch, query_len, tuple(aux_layer_ids))
        rows = host_to_device(step.logits_rows, torch.int64, self.device)
        logits = self.model.compute_logits(hidden[rows])
        return logits, (aux[rows] if aux is not None else None)

    def _load(self, step: PaddedStep) -> None:
        """Copy the step's inputs into the static buffers (host arrays -> one pinned tensor per buffer)."""
        n, b = step.num_tokens, step.batch
        tokens = np.stack((step.input_ids.ravel(), step.positions.ravel(), step.slot_mapping.ravel()))
        width = step.block_tables.shape[1]
        starts = torch.arange(0, (b + 1) * step.query_len, step.query_len, dtype=torch.int32)
        for target, values in (
            (self._tokens[:, :n], torch.from_numpy(tokens)),
            (self._seq_lens[:b], torch.from_numpy(step.seq_lens.astype(np.int32))),
            (self._tables[:b, :width], torch.from_numpy(step.block_tables.astype(np.int32))),
            (self._query_start[: b + 1], starts),
        ):
            target.copy_(values.pin_memory() if self.capture else values, non_blocking=True)

    def _metadata(self, batch: int, query_len: int) -> AttentionMetadata:
        n = batch * query_len
        return AttentionMetadata(
            slot_mapping=self._tokens[2, :n],
            query_start_loc=self._query_start[: batch + 1],
            seq_lens=self._seq_lens[:batch],
            block_tables=self._tables[:batch],
            query_lens=[query_len] * batch,
            # Torch-backend fields (the graphs run the Triton backend, which reads only the tensors above).
            context_lens=[0] * batch,
            max_query_len=query_len,
            max_seq_len=self.width * self.block_size,
            block_size=self.block_size,
            block_runs=None,  # the graphs run the Triton backend
        )

    def _forward(
        self, batch: int, query_len: int, aux_layer_ids: tuple[int, ...]
    ) -> tuple[Tensor, Tensor | None]:
        """The padded forward over the static buffers: hidden (batch * q, hidden) and the aux concatenated."""
        n = batch * query_len
        attn = self._metadata(batch, query_len)
        if not self.capture:  # eager: the torch backend needs the real context lengths for its mask
            seq_lens = self._seq_lens[:batch].tolist()
            attn = replace(attn, context_lens=[s - query_len for s in seq_lens], max_seq_len=max(seq_lens))
        ids, positions = self._tokens[0, :n], self._tokens[1, :n]
        if not aux_layer_ids:
            return self.model(ids, positions, self.kv_caches, attn), None
        hidden, aux = self.model.forward_with_aux(ids, positions, self.kv_caches, attn, aux_layer_ids)
        return hidden, torch.cat(aux, dim=-1)

    def _capture(self, batch: int, query_len: int, aux_layer_ids: tuple[int, ...]) -> _Graph:
        """Warm up on a side stream, then record the padded forward over the static buffers into a graph.

        The buffers then hold this step's inputs, whose padding writes only the scratch block; the real
        requests' KV is rewritten with the same values (the same tokens at the same positions).
        """
        stream = self._warmup_stream
        assert stream is not None
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(batch, query_len, aux_layer_ids)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a drafter loading in a background thread may allocate while this captures.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            hidden, aux = self._forward(batch, query_len, aux_layer_ids)
        return _Graph(graph, hidden, aux)


@dataclass(frozen=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    hidden: Tensor  # static output: (batch * q, hidden_size)
    aux: Tensor | None  # static output: (batch * q, len(aux_layer_ids) * hidden_size)
