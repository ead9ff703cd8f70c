"""DFlash draft forwards as fixed shapes: padded to batch buckets, then replayed from CUDA graphs (captured on
first use), the drafter's twin of :mod:`step_graphs`.

Every block has the drafter's full width T (K + 1 slots, at most the checkpoint's block_size); a block that
needs fewer slots masks the rest as keys (``block_lens``) and its extra slots' drafts are dropped. The batch is
padded to a bucket with padding rows: token 0 at position 0, an empty context and a full block, so they read
no page of the context cache, and nothing in a draft forward writes one. Block tables are padded to ``width``
columns; only the columns a step's contexts use are copied (the kernel never reads past a context; the torch
path reads the stale ones but masks them).

On CUDA each bucket is captured once into a graph over static input buffers, from the token ids to the argmax
draft ids; a replay copies the step's inputs into the buffers and the draft ids are read back once.
``DraftGraphs(..., capture=False)`` runs the same padded forward eagerly (the CPU path of the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.engine_core.models.dflash import BlockContext
from openinfer.engine_core.spec_decode.drafter import DraftQuery
from openinfer.engine_core.worker.step_graphs import BATCH_BUCKETS, bucket_for

# (ids (B, T) int64, positions (B * T,) int64, context) -> (B, K, vocab) draft logits
DraftForward = Callable[[Tensor, Tensor, BlockContext], Tensor]


@dataclass(frozen=True)
class PaddedBlocks:
    """A batch of draft blocks padded to ``batch`` rows (host lists, ready to copy)."""

    batch: int
    rows: list[list[int]]  # (3, batch): current token, position (== context length), block length
    block_tables: list[list[int]]  # (batch, columns): the columns the contexts use, page 0 past a table


def pad_blocks(
    queries: Sequence[DraftQuery], block_lens: Sequence[int], batch: int, block_width: int, page_size: int
) -> PaddedBlocks:
    """Pad the queries' blocks to ``batch`` rows; padding rows have an empty context and a full block."""
    columns = max(-(-q.position // page_size) for q in queries)
    pad = batch - len(queries)
    rows = [
        [q.current_token for q in queries] + [0] * pad,
        [q.position for q in queries] + [0] * pad,
        list(block_lens) + [block_width] * pad,
    ]
    tables = [(q.block_ids + [0] * columns)[:columns] for q in queries] + [[0] * columns] * pad
    return PaddedBlocks(batch, rows, tables)


class DraftGraphs:
    """One drafter's padded draft forwards over static buffers, replayed from CUDA graphs when capturing."""

    def __init__(
        self,
        forward: DraftForward,
        *,
        mask_token_id: int,
        block_width: int,
        page_size: int,
        width: int,
        max_batch: int,
        device: torch.device,
        capture: bool,
    ) -> None:
        self.forward, self.mask_token_id = forward, mask_token_id
        self.block_width, self.page_size, self.width = block_width, page_size, width  # T, page, table columns
        self.max_batch = max(b for b in BATCH_BUCKETS if b <= max(max_batch, 1))
        self.capture = capture  # False: the padded forward runs eagerly (the CPU tests' path)
        self.num_runs = 0  # padded forwards run (graph replays when capturing)
        self._graphs: dict[int, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._warmup_stream = torch.cuda.Stream(device) if capture else None
        # Static inputs: every replay reads these; a copy of the step's values refreshes them.
        self._rows = torch.zeros((3, self.max_batch), dtype=torch.int64, device=device)  # see PaddedBlocks
        self._tables = torch.zeros((self.max_batch, width), dtype=torch.int32, device=device)
        self._slots = torch.arange(block_width, device=device)  # (T,) slot offsets within a block

    def fits(self, queries: Sequence[DraftQuery]) -> int | None:
        """The batch bucket these queries run padded in, or None (run them eagerly)."""
        if max(-(-q.position // self.page_size) for q in queries) > self.width:
            return None
        return bucket_for(len(queries), self.max_batch)

    def run(self, queries: Sequence[DraftQuery], block_lens: Sequence[int], batch: int) -> list[list[int]]:
        """K greedy draft ids per query (query order), from the padded forward: one read-back."""
        self._load(pad_blocks(queries, block_lens, batch, self.block_width, self.page_size))
        self.num_runs += 1
        if self.capture:
            graph = self._graphs.get(batch)
            if graph is None:
                graph = self._graphs[batch] = self._capture(batch)
            graph.graph.replay()
            draft_ids = graph.draft_ids
        else:
            draft_ids = self._forward(batch)
        return draft_ids[: len(queries)].tolist()

    def _load(self, blocks: PaddedBlocks) -> None:
        """Copy the blocks' inputs into the static buffers (one pinned host tensor per buffer on CUDA)."""
        columns = len(blocks.block_tables[0])
        copies = [(self._rows[:, : blocks.batch], torch.tensor(blocks.rows, dtype=torch.int64))]
        if columns:
            tables = torch.tensor(blocks.block_tables, dtype=torch.int32)
            copies.append((self._tables[: blocks.batch, :columns], tables))
        for target, values in copies:
            target.copy_(values.pin_memory() if self.capture else values, non_blocking=True)

    def _forward(self, batch: int) -> Tensor:
        """The padded forward over the static buffers: (batch, K) int64 greedy draft ids."""
        tokens, positions, block_lens = self._rows[:, :batch]  # (batch,) each
        ids = torch.where(self._slots == 0, tokens[:, None], self.mask_token_id)  # (batch, T)
        context = BlockContext(
            block_tables=self._tables[:batch],
            context_lens=positions,
            block_lens=block_lens,
            max_context_len=self.width * self.page_size,
            page_size=self.page_size,
            block_width=self.block_width,
        )
        logits = self.forward(ids, (positions[:, None] + self._slots).flatten(), context)  # (batch, K, vocab)
        return logits.argmax(dim=-1)

    def _capture(self, batch: int) -> _Graph:
        """Warm up on a side stream (Triton compiles, the RoPE table is built), then record the padded
        forward over the static buffers into a graph. A draft forward writes no cache: capturing is free of
        side effects."""
        stream = self._warmup_stream
        assert stream is not None
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(batch)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a drafter loading in a background thread may allocate while this captures.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            draft_ids = self._forward(batch)
        return _Graph(graph, draft_ids)


@dataclass(frozen=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    draft_ids: Tensor  # static output: (batch, K) int64
