"""DFlash draft forwards as fixed shapes: padded to batch buckets, then replayed from CUDA graphs (captured on
first use), the drafter's twin of :mod:`step_graphs`.

Every block has the drafter's full width T (K + 1 slots, at most the checkpoint's block_size); a block that
needs fewer slots masks the rest as keys (``block_lens``) and its extra slots' drafts are dropped. The batch is
padded to a bucket with padding rows: token 0 at position 0, an empty context and a full block, so they read
no page of the context cache, and nothing in a draft forward writes one. Block tables are padded to ``width``
columns; only the columns a step's contexts use are copied (the kernel never reads past a context; the torch
path reads the stale ones but masks them).

On CUDA each bucket is captured once into a graph over static input buffers, from the token ids to the draft
ids: greedy, and (a second graph per bucket, for steps with a request at temperature > 0) sampled, the
temperatures and the uniforms each draw reads being static inputs too (``draft_sampling``), the distributions
the drafts were drawn from a static output. The engine fills the buffers from the step's device output
(``run_on_device``: device-to-device copies, the block tables from the host) and reads the draft ids in the
step's one read-back; ``run`` takes host queries and reads its greedy drafts itself (tests and tools).
``DraftGraphs(..., capture=False)`` runs the same padded forward eagerly (the CPU path of the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from openinfer.engine_core.models.block_attention import BlockContext
from openinfer.engine_core.spec_decode.draft_sampling import DraftSampling
from openinfer.engine_core.spec_decode.drafter import DraftQuery
from openinfer.engine_core.worker.runner_output import DeviceDrafts
from openinfer.engine_core.worker.step_graphs import bucket_for

# (ids (B, T) int64, positions (B * T,) int64, context, sampling or None) -> the B blocks' K drafts, greedy or
# drawn (with their distributions), and confidences
DraftForward = Callable[[Tensor, Tensor, BlockContext, DraftSampling | None], DeviceDrafts]


def padded_drafts(
    forward: DraftForward,
    tokens: Tensor,
    positions: Tensor,
    block_lens: Tensor,
    block_tables: Tensor,
    *,
    mask_token_id: int,
    page_size: int,
    block_width: int,
    sampling: DraftSampling | None = None,
    host_tables: list[list[int]] | None = None,
) -> DeviceDrafts:
    """The drafts of B padded blocks given on the device: tokens, positions (== context lengths) and
    block_lens (B,) int64, block_tables (B, columns) (``host_tables``: the same unpadded on the host, where
    the host has them). Every block is ``block_width`` slots (the current token, then mask tokens; slots past
    block_lens[b] are masked as keys); the torch path gathers the context up to the tables' columns. Greedy,
    or with ``sampling`` drawn."""
    slots = torch.arange(block_width, device=tokens.device)  # (T,) slot offsets within a block
    ids = torch.where(slots == 0, tokens[:, None], mask_token_id)  # (B, T)
    context = BlockContext(
        block_tables=block_tables,
        context_lens=positions,
        block_lens=block_lens,
        max_context_len=block_tables.shape[1] * page_size,
        page_size=page_size,
        block_width=block_width,
        host_tables=host_tables,
    )
    return forward(ids, (positions[:, None] + slots).flatten(), context, sampling)


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
        num_drafts: int,
        page_size: int,
        width: int,
        buckets: Sequence[int],
        device: torch.device,
        capture: bool,
    ) -> None:
        self.forward, self.mask_token_id = forward, mask_token_id
        self.block_width, self.page_size, self.width = block_width, page_size, width  # T, page, table columns
        self.buckets = tuple(buckets)  # requests per padded forward, ascending (the target's)
        self.max_batch = self.buckets[-1]
        self.capture = capture  # False: the padded forward runs eagerly (the CPU tests' path)
        self.num_runs = 0  # padded forwards run (graph replays when capturing)
        self._graphs: dict[tuple[int, bool], _Graph] = {}  # by (bucket, sampled)
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._warmup_stream = torch.cuda.Stream(device) if capture else None
        # Static inputs: every replay reads these; a copy of the step's values refreshes them.
        self._rows = torch.zeros((3, self.max_batch), dtype=torch.int64, device=device)  # see PaddedBlocks
        self._tables = torch.zeros((self.max_batch, width), dtype=torch.int32, device=device)
        self._temperatures = torch.zeros(self.max_batch, dtype=torch.float32, device=device)  # padding: 0
        self._uniforms = torch.zeros((self.max_batch, num_drafts), dtype=torch.float32, device=device)

    def fits(self, queries: Sequence[DraftQuery]) -> int | None:
        """The batch bucket these queries run padded in, or None (run them eagerly)."""
        if max(-(-q.position // self.page_size) for q in queries) > self.width:
            return None
        return bucket_for(len(queries), self.buckets)

    def run(self, queries: Sequence[DraftQuery], block_lens: Sequence[int], batch: int) -> list[list[int]]:
        """K greedy draft ids per query (query order), from the padded forward: one read-back."""
        self._load(pad_blocks(queries, block_lens, batch, self.block_width, self.page_size))
        return self._run(batch, sampled=False).draft_ids[: len(queries)].tolist()

    def fits_tables(self, block_ids: Sequence[list[int]]) -> int | None:
        """The batch bucket of requests with these block tables (whole), or None (run them eagerly)."""
        if max(len(b) for b in block_ids) > self.width:
            return None
        return bucket_for(len(block_ids), self.buckets)

    def run_on_device(
        self,
        tokens: Tensor,
        positions: Tensor,
        block_lens: Tensor,
        block_ids: Sequence[list[int]],
        batch: int,
        sampling: DraftSampling | None = None,
    ) -> DeviceDrafts:
        """The drafts on the device of B blocks given on the device (tokens, positions, block lengths: (B,)
        int64 each) with host block tables, padded to ``batch``, greedy or with ``sampling`` drawn: the inputs
        reach the static buffers by device-to-device copies, nothing is read back. The result views the
        static outputs: read it before the next run."""
        n = tokens.shape[0]
        rows = self._rows
        for i, values in enumerate((tokens, positions, block_lens)):
            rows[i, :n].copy_(values)
        rows[:2, n:batch].zero_()  # padding rows: token 0 at position 0, an empty context, a full block
        rows[2, n:batch].fill_(self.block_width)
        columns = max(len(b) for b in block_ids)
        if columns:
            tables = torch.tensor([b + [0] * (columns - len(b)) for b in block_ids], dtype=torch.int32)
            self._tables[:n, :columns].copy_(
                tables.pin_memory() if self.capture else tables, non_blocking=True
            )
            self._tables[n:batch, :columns].zero_()
        if sampling is not None:
            self._temperatures[:n].copy_(sampling.temperatures)
            self._temperatures[n:batch].zero_()  # padding rows draft greedily
            self._uniforms[:n].copy_(sampling.uniforms)
        drafts = self._run(batch, sampled=sampling is not None)
        return DeviceDrafts(*(None if t is None else t[:n] for t in drafts))  # type: ignore[arg-type]

    def _run(self, batch: int, sampled: bool) -> DeviceDrafts:
        """The padded forward of the loaded buffers: a graph replay when capturing, else eagerly."""
        self.num_runs += 1
        if not self.capture:
            return self._forward(batch, sampled)
        graph = self._graphs.get((batch, sampled))
        if graph is None:
            graph = self._graphs[batch, sampled] = self._capture(batch, sampled)
        graph.graph.replay()
        return graph.drafts

    def _load(self, blocks: PaddedBlocks) -> None:
        """Copy the blocks' inputs into the static buffers (one pinned host tensor per buffer on CUDA)."""
        columns = len(blocks.block_tables[0])
        copies = [(self._rows[:, : blocks.batch], torch.tensor(blocks.rows, dtype=torch.int64))]
        if columns:
            tables = torch.tensor(blocks.block_tables, dtype=torch.int32)
            copies.append((self._tables[: blocks.batch, :columns], tables))
        for target, values in copies:
            target.copy_(values.pin_memory() if self.capture else values, non_blocking=True)

    def _forward(self, batch: int, sampled: bool) -> DeviceDrafts:
        """The padded forward over the static buffers: the batch's drafts, greedy or drawn."""
        tokens, positions, block_lens = self._rows[:, :batch]  # (batch,) each
        sampling = DraftSampling(self._temperatures[:batch], self._uniforms[:batch]) if sampled else None
        return padded_drafts(
            self.forward,
            tokens,
            positions,
            block_lens,
            self._tables[:batch],
            mask_token_id=self.mask_token_id,
            page_size=self.page_size,
            block_width=self.block_width,
            sampling=sampling,
        )

    def _capture(self, batch: int, sampled: bool) -> _Graph:
        """Warm up on a side stream (Triton compiles, the RoPE table is built), then record the padded
        forward over the static buffers into a graph. A draft forward writes no cache: capturing is free of
        side effects."""
        stream = self._warmup_stream
        assert stream is not None
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(batch, sampled)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a drafter loading in a background thread may allocate while this captures.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            drafts = self._forward(batch, sampled)
        return _Graph(graph, drafts)


@dataclass(frozen=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    drafts: DeviceDrafts  # static outputs: ids, confidences or None, the draws' distributions or None
