"""Decode and verify steps as fixed shapes: padded, then replayed from CUDA graphs (captured on first use).

A step is *uniform* when every chunk runs q <= MAX_QUERY_LEN tokens and wants logits for all of them (a
decode, q = 1, or a verification of drafts, q = K + 1). Such a step is padded to a bucket of B requests of q
tokens each: a request with fewer tokens gets padding tokens after its own (causal attention hides them from
its real ones), and padding requests run q tokens over the scratch block. Padding tokens write their keys
and values into the scratch block (one block past the KV manager's, never handed to a request), so nothing a
real request reads is touched, and their outputs are dropped.

On CUDA each (bucket, q, aux layers) shape is captured once into a graph over static input buffers; a replay
copies the step's inputs into the buffers (one host-to-device copy) and launches the whole forward at once.
The LM head runs eagerly on the real rows only. Prefill chunks and steps larger than the largest bucket run
eagerly as they are. ``StepGraphs(..., capture=False)`` runs the same padded step eagerly (the CPU path of the
tests: padding must not change a token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from openinfer.engine_core.executor import SeqChunk
from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.kernels.attention import AttentionMetadata, host_to_device
from openinfer.protocol import MAX_SPEC_TOKENS

MAX_QUERY_LEN = MAX_SPEC_TOKENS + 1  # the longest verification: K drafts and the current token
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
QUERY_BUCKETS = (1, 2, 4, 8, 16, MAX_QUERY_LEN)  # q is padded up to one of these: few shapes to capture


@dataclass(frozen=True)
class PaddedStep:
    """A uniform step padded to ``batch`` requests of ``query_len`` tokens (host lists, ready to copy)."""

    batch: int
    query_len: int
    input_ids: list[int]  # (batch * query_len,)
    positions: list[int]
    slot_mapping: list[int]
    seq_lens: list[int]  # (batch,)
    block_tables: list[list[int]]  # (batch, width)
    logits_rows: list[int]  # rows of the padded hidden states whose logits the step returns, in order

    @property
    def num_tokens(self) -> int:
        return self.batch * self.query_len


def uniform_query_len(chunks: Sequence[SeqChunk]) -> int | None:
    """q, the query bucket of the longest chunk, when every chunk is a decode or verification (logits for all
    its tokens, at most MAX_QUERY_LEN)."""
    if any(c.num_logits != len(c.token_ids) or len(c.token_ids) > MAX_QUERY_LEN for c in chunks):
        return None
    longest = max(len(c.token_ids) for c in chunks)
    return next(q for q in QUERY_BUCKETS if longest <= q)


def bucket_for(num_reqs: int, max_batch: int) -> int | None:
    """The smallest batch bucket holding ``num_reqs`` requests, or None past ``max_batch``."""
    return next((b for b in BATCH_BUCKETS if num_reqs <= b <= max_batch), None)


def pad_step(
    chunks: Sequence[SeqChunk], batch: int, query_len: int, block_size: int, scratch_block: int
) -> PaddedStep:
    """Pad ``chunks`` to ``batch`` requests of ``query_len`` tokens; block tables to the columns this step
    reads (the kernels never read a column past a request's seq_len; the buffer's later ones stay stale)."""
    width = max(-(-(c.start_pos + query_len) // block_size) for c in chunks)
    scratch_slot = scratch_block * block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    rows: list[int] = []
    for b, chunk in enumerate(chunks):
        n, start, table = len(chunk.token_ids), chunk.start_pos, chunk.block_ids
        input_ids += chunk.token_ids + [0] * (query_len - n)
        positions += [*range(start, start + n), *[start] * (query_len - n)]  # any valid RoPE position
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, start + n)]
        slots += [scratch_slot] * (query_len - n)
        seq_lens.append(start + query_len)  # the padding tokens come last: real queries never see them
        tables.append((table + [0] * width)[:width])  # a table may hold more blocks than this step reads
        rows += range(b * query_len, b * query_len + n)
    for _ in range(len(chunks), batch):  # padding requests: query_len tokens in the scratch block
        input_ids += [0] * query_len
        positions += range(query_len)
        slots += [scratch_slot + p % block_size for p in range(query_len)]
        seq_lens.append(query_len)
        tables.append([scratch_block] * width)
    return PaddedStep(batch, query_len, input_ids, positions, slots, seq_lens, tables, rows)


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

    def fits(self, chunks: Sequence[SeqChunk]) -> tuple[int, int] | None:
        """(bucket, q) when this step can run padded, else None (run it eagerly as it is)."""
        query_len = uniform_query_len(chunks)
        batch = bucket_for(len(chunks), self.max_batch)
        if query_len is None or batch is None:
            return None
        return batch, query_len

    def run(
        self, chunks: Sequence[SeqChunk], batch: int, query_len: int, aux_layer_ids: Sequence[int] = ()
    ) -> tuple[Tensor, Tensor | None]:
        """Logits of the chunks' tokens (chunk order) and, with ``aux_layer_ids``, their aux hidden states."""
        step = pad_step(chunks, batch, query_len, self.block_size, self.scratch_block)
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
        """Copy the step's inputs into the static buffers (host lists -> one pinned tensor per buffer)."""
        n, b = step.num_tokens, step.batch
        tokens = torch.tensor([step.input_ids, step.positions, step.slot_mapping], dtype=torch.int64)
        width = len(step.block_tables[0])
        starts = torch.arange(0, (b + 1) * step.query_len, step.query_len, dtype=torch.int32)
        for target, values in (
            (self._tokens[:, :n], tokens),
            (self._seq_lens[:b], torch.tensor(step.seq_lens, dtype=torch.int32)),
            (self._tables[:b, :width], torch.tensor(step.block_tables, dtype=torch.int32)),
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
