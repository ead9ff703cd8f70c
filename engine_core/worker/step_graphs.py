"""Decode and verify steps as fixed shapes: padded, then replayed from CUDA graphs (captured on first use).

A step is *uniform* when every chunk runs q <= MAX_QUERY_LEN tokens and wants logits for all of them (a
decode, q = 1, or a verification of drafts, q = K + 1). Such a step is padded to a bucket of B requests of q
tokens each: a request with fewer tokens gets padding tokens after its own (causal attention hides them from
its real ones), and padding requests run q tokens over the scratch block. Padding tokens write their keys
and values into the scratch block (one block past the KV manager's, never handed to a request), so nothing a
real request reads is touched, and their outputs are dropped.

A hybrid model's (Qwen3.5's Gated DeltaNet) state slots are inputs too: a real request reads its slot and
its tokens write theirs; padding requests start from zeros and padding tokens store no state (slot -1, which
the kernels' stores skip: a padding token comes after its request's last, so the state it would store is
never wanted). On the padded grid every request runs exactly q tokens, so the kernels' short (recurrent)
form reads only device tensors: static buffers and views of them (`_state_index`); steps of q >
RECURRENT_MAX_QUERY_LEN would take the long form, which reads host lists, and run eagerly.

On CUDA each (bucket, q, aux layers) shape is captured once into a graph over static input buffers; a replay
copies the step's inputs into the buffers (one pinned non-blocking copy per buffer) and launches the whole
forward at once. A shape's first use warms up by running the forward over the loaded step twice before
recording it: the KV writes are idempotent (the same keys and values at the same slots), a state update is
not (a decode may read and write one slot), so meanwhile every state write goes to the scratch state slot;
then the step runs once from the graph.
The LM head runs eagerly on the real rows only. Prefill chunks and steps larger than the largest bucket run
eagerly as they are. ``StepGraphs(..., capture=False)`` runs the same padded step eagerly, the warm-up of a
shape's first use included (the CPU path of the tests: padding and warming up must not change a token or a
state).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.models.qwen3 import Qwen3ForCausalLM
from openinfer.engine_core.worker.step_batch import Int64s, StepBatch
from openinfer.kernels.attention_metadata import AttentionMetadata, find_block_runs
from openinfer.kernels.host_copy import host_to_device
from openinfer.kernels.state_index import RECURRENT_MAX_QUERY_LEN, StateIndex
from openinfer.protocol import MAX_SPEC_TOKENS

MAX_QUERY_LEN = MAX_SPEC_TOKENS + 1  # the longest verification: K drafts and the current token
QUERY_BUCKETS = (1, 2, 4, 8, 16, MAX_QUERY_LEN)  # q is padded up to one of these: few shapes to capture
WARMUP_RUNS = 2  # forwards over a shape's first step before it is recorded


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
    # a hybrid model's state slots (None for a model without state): the slot each request starts from, -1
    # (zeros) for padding requests (batch,); the slot each token's state goes to, -1 (none) for padding
    # tokens (batch, query_len)
    state_read: Int64s | None = None
    state_write: Int64s | None = None

    @property
    def num_tokens(self) -> int:
        return self.batch * self.query_len


def uniform_query_len(step: StepBatch) -> int | None:
    """q, the query bucket of the longest chunk, when every chunk is a decode or verification (logits for all
    its tokens, at most MAX_QUERY_LEN)."""
    if step.max_query_len > MAX_QUERY_LEN or not step.logits_for_every_token:
        return None
    return next(q for q in QUERY_BUCKETS if step.max_query_len <= q)


def bucket_for(num_reqs: int, buckets: Sequence[int]) -> int | None:
    """The smallest of the (ascending) batch ``buckets`` holding ``num_reqs`` requests, or None past the last."""
    return next((b for b in buckets if num_reqs <= b), None)


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
    state_read = state_write = None
    if step.state_read is not None and step.state_write is not None:
        # -1, not the scratch slot: every padding token would share it, and a store's rows must not share a
        # slot (kernels/gated_delta.py masked_store); -1 stores nothing and reads zeros.
        state_read = np.full(batch, -1, dtype=np.int64)
        state_read[:real] = step.state_read
        state_write = np.full((batch, q), -1, dtype=np.int64)
        state_write[:real][valid] = step.state_write
    return PaddedStep(batch, q, input_ids, positions, slots, seq_lens, tables, rows, state_read, state_write)


class StepGraphs:
    """Uniform steps of one model over its KV caches (and a hybrid model's state slots, ``state_geometry``),
    padded to buckets and (on CUDA) replayed from graphs."""

    def __init__(
        self,
        model: Qwen3ForCausalLM,
        kv_caches: list[Tensor],
        block_size: int,
        scratch_block: int,
        max_model_len: int,
        buckets: Sequence[int],
        capture: bool,
        state_geometry: StateGeometry | None = None,
    ) -> None:
        self.model, self.kv_caches, self.device = model, kv_caches, kv_caches[0].device
        self.block_size, self.scratch_block = block_size, scratch_block
        # a hybrid model's scratch state slot: the warm-up's state writes go there (None: no state)
        self.scratch_state = state_geometry.scratch_slot if state_geometry is not None else None
        # requests per padded step, ascending (compilation_config.capture_sizes)
        self.buckets = tuple(buckets)
        self.max_batch = self.buckets[-1]
        self.width = -(-(max_model_len + MAX_QUERY_LEN) // block_size)  # block-table columns
        self.capture = capture  # False: the padded step runs eagerly (the CPU tests' path)
        # per shape, its graph (None without capture: the shape has warmed up, and runs eagerly)
        self._graphs: dict[tuple[int, int, tuple[int, ...]], _Graph | None] = {}
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
        # A hybrid model's state slots: (max_batch,) each request's read slot, (max_tokens,) each token's write
        # slot (-1: zeros / none); and the padded grid's token indices, 0..max_tokens-1 (token b * q + i is
        # request b's position i), which never change.
        self._state_read = torch.full((self.max_batch,), -1, dtype=torch.int64, device=self.device)
        self._state_write = torch.full((max_tokens,), -1, dtype=torch.int64, device=self.device)
        self._grid = torch.arange(max_tokens, dtype=torch.int64, device=self.device)

    def fits(self, step: StepBatch) -> tuple[int, int] | None:
        """(bucket, q) when this step can run padded, else None (run it eagerly as it is): a hybrid model's
        up to RECURRENT_MAX_QUERY_LEN tokens a request (the DeltaNet kernels' longer form reads host lists)."""
        query_len = uniform_query_len(step)
        batch = bucket_for(step.num_chunks, self.buckets)
        if query_len is None or batch is None:
            return None
        if self.scratch_state is not None and query_len > RECURRENT_MAX_QUERY_LEN:
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
        if key not in self._graphs:
            self._graphs[key] = self._capture(batch, query_len, tuple(aux_layer_ids))
        graph = self._graphs[key]
        if graph is not None:
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
        copies = [
            (self._tokens[:, :n], torch.from_numpy(tokens)),
            (self._seq_lens[:b], torch.from_numpy(step.seq_lens.astype(np.int32))),
            (self._tables[:b, :width], torch.from_numpy(step.block_tables.astype(np.int32))),
            (self._query_start[: b + 1], starts),
        ]
        if self.scratch_state is not None:
            if step.state_read is None or step.state_write is None:
                raise ValueError(
                    "a hybrid model's step must name its state slots (StepBatch.state_read/write)"
                )
            copies.append((self._state_read[:b], torch.from_numpy(step.state_read)))
            copies.append((self._state_write[:n], torch.from_numpy(step.state_write.ravel())))
        for target, values in copies:
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
            block_runs=None,  # the graphs run the Triton backend (the CPU twin finds them, `_forward`)
            states=self._state_index(batch, query_len) if self.scratch_state is not None else None,
        )

    def _state_index(self, batch: int, query_len: int) -> StateIndex:
        """The padded grid's state slots over the static buffers: every request runs exactly q tokens, so the
        grid is the tokens in order (padded_tokens, token_positions: views of the static 0, 1, ...) and its
        write slots are the write buffer's (batch, q) view. Only the kernels' short form may read it, which
        reads nothing but these tensors; the host fields are the long form's: query_start_loc depends on
        the shape alone, host_write_slots is empty (a replay would find any step's stale)."""
        if query_len > RECURRENT_MAX_QUERY_LEN:
            raise AssertionError(
                f"q = {query_len} would take the DeltaNet kernels' long form: fits() refuses it"
            )
        n = batch * query_len
        writes, grid = self._state_write[:n], self._grid[:n]
        return StateIndex(
            query_start_loc=list(range(0, n + 1, query_len)),
            read_slots=self._state_read[:batch],
            write_slots=writes,
            host_write_slots=[],
            zero_reads=True,  # the CPU's safe general path: the host facts would be stale on a replay
            own_block=None,
            max_query_len=query_len,
            padded_tokens=grid.view(batch, query_len),
            padded_write_slots=writes.view(batch, query_len),
            token_positions=grid,
        )

    def _forward(
        self, batch: int, query_len: int, aux_layer_ids: tuple[int, ...]
    ) -> tuple[Tensor, Tensor | None]:
        """The padded forward over the static buffers: hidden (batch * q, hidden) and the aux concatenated."""
        n = batch * query_len
        attn = self._metadata(batch, query_len)
        if not self.capture:  # eager: the torch backend needs the real context lengths (and on the CPU the
            # runs of blocks a lone request's keys are read from)
            seq_lens = self._seq_lens[:batch].numpy(force=True).astype(np.int64)
            tables = self._tables[:batch].numpy(force=True).astype(np.int64)
            runs = find_block_runs(tables, seq_lens, self.block_size) if self.device.type == "cpu" else None
            contexts = (seq_lens - query_len).tolist()
            attn = replace(attn, context_lens=contexts, max_seq_len=int(seq_lens.max()), block_runs=runs)
        ids, positions = self._tokens[0, :n], self._tokens[1, :n]
        if not aux_layer_ids:
            return self.model(ids, positions, self.kv_caches, attn), None
        hidden, aux = self.model.forward_with_aux(ids, positions, self.kv_caches, attn, aux_layer_ids)
        return hidden, torch.cat(aux, dim=-1)

    def _capture(self, batch: int, query_len: int, aux_layer_ids: tuple[int, ...]) -> _Graph | None:
        """A shape's first use, over the loaded step: WARMUP_RUNS forwards (on a side stream on CUDA), then on
        CUDA the padded forward recorded into a graph over the static buffers (None without capture: the CPU
        twin warms up the same way, then runs the step eagerly). The caller then runs the step once.

        The real requests' KV is rewritten with the same values each time (the same tokens at the same
        positions, from the same states: the read slots stay), padding writes only the scratch block. State
        writes are not idempotent (a decode may read and write one slot): they all go to the scratch slot
        meanwhile (`_state_writes_to_scratch`).
        """
        n, stream = batch * query_len, self._warmup_stream
        with self._state_writes_to_scratch(n):
            if stream is None:
                for _ in range(WARMUP_RUNS):
                    self._forward(batch, query_len, aux_layer_ids)
                return None
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_RUNS):
                    self._forward(batch, query_len, aux_layer_ids)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # thread_local: a drafter loading in a background thread may allocate while this captures.
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                hidden, aux = self._forward(batch, query_len, aux_layer_ids)
        return _Graph(graph, hidden, aux)

    @contextmanager
    def _state_writes_to_scratch(self, num_tokens: int) -> Iterator[None]:
        """Inside: every token's state goes to the scratch slot (which then holds any of them: nothing reads
        it), so forwards run any number of times leave every other slot as it was; after: the loaded step's
        write slots again. Nothing for a model without state."""
        if self.scratch_state is None:
            yield
            return
        writes = self._state_write[:num_tokens]
        saved = writes.clone()
        writes.fill_(self.scratch_state)
        try:
            yield
        finally:
            writes.copy_(saved)


@dataclass(frozen=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    hidden: Tensor  # static output: (batch * q, hidden_size)
    aux: Tensor | None  # static output: (batch * q, len(aux_layer_ids) * hidden_size)
