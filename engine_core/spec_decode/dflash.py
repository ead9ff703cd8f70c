"""The DFlash proposer: keeps every request's draft context keys/values in a paged cache that shares the
target's block ids, and drafts one block per request in a single batched forward."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from openinfer.engine_core.models.block_attention import BlockContext, follow_backend
from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
from openinfer.engine_core.models.drafter_fit import check_fits_target
from openinfer.engine_core.spec_decode.dflash_graphs import DraftGraphs, padded_drafts
from openinfer.engine_core.spec_decode.draft_numbers import finite_slots
from openinfer.engine_core.spec_decode.draft_sampling import (
    DraftSampling,
    draft_sampling,
    draw_slots,
    markov_stage,
)
from openinfer.engine_core.spec_decode.drafter import (
    ContextRows,
    DeviceQueries,
    DraftQuery,
    DraftTarget,
)
from openinfer.engine_core.spec_decode.drafter_budget import context_caches, load_within_budget
from openinfer.engine_core.worker.executor import reachable_positions
from openinfer.engine_core.worker.runner_output import DeviceDrafts
from openinfer.kernels.host_copy import host_to_device
from openinfer.protocol.counters import num_spec_tokens_problem


class DFlashDrafter:
    """Drafts with a z-lab DFlash checkpoint beside `runner`'s target, sharing its embedding and LM head
    (:class:`DraftTarget`: the target's hidden states in, its embedding and head out).

    Its context cache has the target's paging (runner.num_kv_blocks pages of runner.block_size slots, one
    tensor per draft layer) and is indexed by the target's block ids: position p's context key/value lives in
    the target's slot for p, so the target's block allocation covers it and no allocator of its own is needed.

    Invariant: a draft block reads only context positions < its query's position (its context length, on the
    device in ``propose_on_device``), all verified; the engine calls `extend_context` before the step's
    read-back for every position the target ran for a request that may draft, drafts and rejected positions
    included (it cannot know yet which were accepted), in order. An entry at a rejected position (or left by
    a previous owner of the block) lies at or past the request's next position, so it is never read before
    the target runs that position again, and that step's `extend_context` overwrites it before its drafts
    are proposed: nothing is ever rolled back. Which blocks hold valid context for prefix-cache hits is the
    host's record (``ContextBlocks``), kept from the accepted counts once they are read back.

    Its attention follows the target's backend (:func:`follow_backend`), and so do its CUDA graphs: when the
    runner has ``step_graphs`` (CUDA, Triton, no ``--enforce-eager``; or padded eagerly in tests), drafts run
    padded through :class:`DraftGraphs` with the same ``capture`` flag, batches past its buckets eagerly.
    """

    def __init__(
        self,
        path: Path,
        runner: DraftTarget,
        num_spec_tokens: int,
        anchor: AnchorLayout | None = None,
        config: DFlashConfig | None = None,  # the folder's, read and checked against this target already
    ) -> None:
        if config is None:
            config = DFlashConfig.from_folder(path, anchor)
            check_fits_target(config, runner.model_config)
        problem = num_spec_tokens_problem(num_spec_tokens)
        if problem is not None:
            raise ValueError(problem)
        if num_spec_tokens > config.max_drafts:
            raise ValueError(
                f"num_spec_tokens {num_spec_tokens} is more than one DFlash block yields: block_size "
                f"{config.block_size} with the {config.anchor.value} layout drafts at most "
                f"{config.max_drafts} tokens; use --num-spec-tokens {config.max_drafts} or less"
            )
        self.config = config
        self.num_spec_tokens = num_spec_tokens
        self.aux_layer_ids: tuple[int, ...] = config.target_layer_ids  # pass to forward_with_aux
        self.device, self.dtype = runner.device, runner.dtype
        self.page_size = runner.block_size  # KV-cache block size (config.block_size is the draft block's)
        self.num_pages = runner.num_kv_blocks
        self._target = runner
        # RoPE table: a block's slots run up to block_size positions past the model length.
        target_positions = runner.model_config.max_position_embeddings
        max_positions = reachable_positions(target_positions, runner.num_kv_blocks, runner.block_size)
        max_positions += config.block_size  # a block's slots past the context
        attention = follow_backend(runner.attn_backend, runner.device)
        self.model = load_within_budget(path, config, attention, runner, max_positions)
        # Drafts at temperature > 0 are drawn with each request's own generator, else with this one.
        self.generator = torch.Generator(self.device).manual_seed(0)
        # (num_layers, 2, num_pages, page_size, kv_heads, head_dim): layer l's cache is context_caches[l]
        self.context_caches = context_caches(config.layers, runner)
        self._layer_caches = self.context_caches.unbind(0)
        step_graphs = runner.step_graphs
        self.graphs: DraftGraphs | None = None
        if step_graphs is not None:
            self.graphs = DraftGraphs(
                lambda ids, positions, context, sampling: self._drafts(
                    ids, positions, context, num_spec_tokens, sampling
                ),
                mask_token_id=config.mask_token_id,
                block_width=self.block_width,  # every block_length fits
                num_drafts=num_spec_tokens,
                page_size=self.page_size,
                width=step_graphs.width,
                buckets=step_graphs.buckets,
                device=self.device,
                capture=step_graphs.capture,
            )

    @property
    def estimates_confidence(self) -> bool:
        """Whether it rates its drafts (DSpark's confidence head): ``DeviceDrafts.confidence``."""
        return self.model.confidence_head is not None

    def describe(self) -> str:
        return self.config.describe(self.num_spec_tokens)

    @torch.inference_mode()
    def extend_context(self, rows: ContextRows) -> None:
        """Write the draft context keys/values of every row's position into its slot (fc + hidden_norm, then
        each draft layer's k_proj/k_norm/RoPE and v_proj), all rows in one batch."""
        n = rows.hidden.shape[0]
        if n == 0:
            return
        width = len(self.aux_layer_ids) * self.config.target_hidden_size
        if rows.hidden.dim() != 2 or rows.hidden.shape[1] != width:
            raise ValueError(
                f"context hidden states must be (n, {width}) = (n, {len(self.aux_layer_ids)} aux "
                f"layers x {self.config.target_hidden_size}), got {tuple(rows.hidden.shape)}"
            )
        if rows.positions.shape != (n,) or rows.slots.shape != (n,):
            raise ValueError(f"{n} context rows need {n} positions and slots")
        if rows.positions.min() < 0 or rows.slots.min() < 0 or rows.slots.max() >= self.num_slots:
            raise ValueError(f"context slots must be in [0, {self.num_slots}) at positions >= 0")
        self.model.write_context(
            rows.hidden.to(self.device, self.dtype),
            torch.tensor(rows.positions, device=self.device),
            torch.tensor(rows.slots, device=self.device),
            self.context_caches,
        )

    @property
    def num_slots(self) -> int:
        """Positions the context cache holds: its pages times their size."""
        return self.num_pages * self.page_size

    @property
    def block_width(self) -> int:
        """The most slots a draft block has: block_size for a DeepSpec checkpoint, else K + 1 within it."""
        if self.config.is_deepspec:
            return self.config.block_size
        return min(self.num_spec_tokens + 1, self.config.block_size)

    def block_length(self, query: DraftQuery) -> int:
        """Slots of the query's draft block. z-lab's layout: the current token, then a mask token per draft
        asked for and one more (z-lab's `dflash_generate` verifies a block of K + 1 tokens, cut at the end of
        the request to the tokens left to generate, the last of which needs no draft); never more than the
        checkpoint's block_size, so K < block_size - 1 drafts from a block of K + 1 slots, as the reference
        does when it is given block_size K + 1. DeepSpec's layout: always block_size slots, the current
        token and block_size - 1 masks, whatever K or the request has left (DeepSpec's loop runs every block
        whole and cuts the drafts; attention inside a block is non-causal, so its length changes them)."""
        if self.config.is_deepspec:
            return self.block_width
        return min(self.block_width, query.max_drafts + 2)

    @torch.inference_mode()
    def propose(self, queries: list[DraftQuery]) -> list[list[int]]:
        """Greedy drafts for every query (up to its max_drafts), in query order, from ONE batched forward:
        the argmax of :meth:`draft_logits`, padded through ``graphs`` when they hold the batch."""
        drafts: list[list[int]] = [[] for _ in queries]
        active = [i for i, query in enumerate(queries) if self._check_query(query) > 0]
        if active:
            for i, row in zip(active, self._draft_ids([queries[i] for i in active]), strict=True):
                drafts[i] = row[: queries[i].max_drafts]
        return drafts

    @torch.inference_mode()
    def propose_on_device(self, queries: DeviceQueries) -> DeviceDrafts:
        """(B, K) draft ids (and, with a confidence head, their confidences) on the device from ONE batched
        forward of blocks padded to the drafter's width (``DraftGraphs`` when a bucket holds them, else
        eagerly), nothing read back: greedy, or drawn at the requests' temperatures with the distributions
        they were drawn from. Each block's length (``block_length``) comes from its device max_drafts."""
        block_width = self.block_width
        # block_length on the device: min(K + 1, max_drafts + 2, block_size), or block_size for DeepSpec's
        if self.config.is_deepspec:
            block_lens = torch.full_like(queries.max_drafts, block_width)  # (B,)
        else:
            block_lens = torch.clamp(queries.max_drafts + 2, max=block_width)  # (B,)
        sampling = draft_sampling(queries, self.generator, self.num_spec_tokens)  # None: all greedy
        if self.graphs is not None:
            bucket = self.graphs.fits_tables(queries.block_ids)
            if bucket is not None:
                return self.graphs.run_on_device(
                    queries.current_tokens, queries.positions, block_lens, queries.block_ids, bucket, sampling
                )
        columns = max(len(b) for b in queries.block_ids)
        tables = host_to_device(
            [t for b in queries.block_ids for t in (*b, *[0] * (columns - len(b)))], torch.int64, self.device
        ).view(len(queries.block_ids), columns)  # (B, columns)
        return padded_drafts(
            lambda ids, positions, context, sampling: self._drafts(
                ids, positions, context, self.num_spec_tokens, sampling
            ),
            queries.current_tokens,
            queries.positions,
            block_lens,
            tables,
            mask_token_id=self.config.mask_token_id,
            page_size=self.page_size,
            block_width=block_width,
            sampling=sampling,
            host_tables=[list(b) for b in queries.block_ids],
        )

    def _draft_ids(self, batch: list[DraftQuery]) -> list[list[int]]:
        """Greedy draft ids per query (at least its max_drafts), read back once: padded through ``graphs``
        when a bucket holds the batch, else eagerly."""
        if self.graphs is not None:
            bucket = self.graphs.fits(batch)
            if bucket is not None:
                return self.graphs.run(batch, [self.block_length(q) for q in batch], bucket)
        return self._block_logits(batch).argmax(dim=-1).tolist()  # (B, max max_drafts)

    @torch.inference_mode()
    def draft_logits(self, queries: list[DraftQuery]) -> list[Tensor]:
        """Each query's draft logits, (max_drafts, vocab) float32, from the forward `propose` runs when it
        runs eagerly (the padded one gives the same drafts)."""
        for query in queries:
            self._check_query(query)
        active = [q for q in queries if q.max_drafts > 0]
        logits = iter(self._block_logits(active)) if active else iter(())
        return [next(logits)[: q.max_drafts] if q.max_drafts > 0 else torch.empty(0) for q in queries]

    def _block_logits(self, batch: list[DraftQuery]) -> Tensor:
        """(B, max max_drafts, vocab) draft logits of a batch of queries that each want drafts, eagerly.

        Each block is the current token then mask tokens, at positions p..p+n-1 (n = `block_length`); blocks
        shorter than the batch's longest are padded, the padding masked out as keys. Attention is non-causal
        inside the block and sees the request's context positions [0, p)."""
        lengths = [self.block_length(q) for q in batch]
        block_width = max(lengths)  # the padded block width of this batch
        token_ids = [[q.current_token] + [self.config.mask_token_id] * (block_width - 1) for q in batch]
        positions = [q.position + j for q in batch for j in range(block_width)]
        width = max(len(q.block_ids) for q in batch)
        tables = [q.block_ids + [0] * (width - len(q.block_ids)) for q in batch]
        context = BlockContext(
            block_tables=torch.tensor(tables, dtype=torch.int64, device=self.device).view(len(batch), width),
            context_lens=torch.tensor([q.position for q in batch], device=self.device),  # (B,)
            block_lens=torch.tensor(lengths, device=self.device),  # (B,)
            max_context_len=max(q.position for q in batch),
            page_size=self.page_size,
            block_width=block_width,
            host_tables=[q.block_ids for q in batch],
        )
        ids = torch.tensor(token_ids, dtype=torch.int64, device=self.device)  # (B, block_width)
        positions_t = torch.tensor(positions, dtype=torch.int64, device=self.device)  # (B * block_width,)
        # (B, max max_drafts, vocab) float32: the draft slots' logits, from the layout's first draft slot on
        return self._block(ids, positions_t, context, max(q.max_drafts for q in batch))[0]

    def _drafts(
        self,
        ids: Tensor,
        positions: Tensor,
        context: BlockContext,
        num_drafts: int,
        sampling: DraftSampling | None = None,
    ) -> DeviceDrafts:
        """The drafts of the blocks: greedy (the argmax of the draft slots' logits), or with ``sampling`` drawn slot by
        slot from softmax(logits / T) for the rows with T > 0, with the distributions they were drawn from;
        and, with a confidence head, each slot's confidence from its hidden state and
        (``confidence_head_with_markov``) the Markov embedding of the token before it (DeepSpec's
        ``compute_confidence_logits``; the rows drawn at T > 0 read the sampled head when the drafter has
        one), 0 where it or the slot's logits are not finite (draft_numbers.py)."""
        logits, hidden, prev_embeds, drawn = self._block(ids, positions, context, num_drafts, sampling)
        draft_ids, probs = (logits.argmax(dim=-1), None) if drawn is None else drawn  # (B, num_drafts)
        finite = finite_slots(logits)  # (B, num_drafts) bool
        head, sampled_head = self.model.confidence_head, self.model.sampled_confidence_head
        confidence = None if head is None else head(hidden, prev_embeds)  # (B, num_drafts) float32
        if confidence is not None and sampled_head is not None and sampling is not None:
            drawn_rows = (sampling.temperatures > 0)[:, None]  # (B, 1): rows drafting at T > 0
            confidence = torch.where(drawn_rows, sampled_head(hidden, prev_embeds), confidence)
        if confidence is not None:
            finite &= confidence.isfinite()
            confidence = torch.where(finite, confidence, 0.0)
        return DeviceDrafts(draft_ids, confidence, probs, finite.all(dim=-1))

    def _block(
        self,
        ids: Tensor,
        positions: Tensor,
        context: BlockContext,
        num_drafts: int,
        sampling: DraftSampling | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None, tuple[Tensor, Tensor] | None]:
        """The block forward: the draft slots' logits (B, num_drafts, vocab) float32, their final hidden
        states (B, num_drafts, hidden), with a Markov head the embeddings of the tokens before them
        (B, num_drafts, r), else None, and with ``sampling`` the drawn drafts (B, num_drafts) and the
        distributions they were drawn from (B, num_drafts, vocab), else None."""
        embeds = self._target.embed(ids) * self.config.input_embedding_scale  # (B, T, hidden)
        hidden = self.model(embeds, positions, self._layer_caches, context)  # (B, T, hidden)
        first = self.config.anchor.first_draft_slot
        draft_hidden = hidden[:, first : first + num_drafts]  # (B, num_drafts, hidden)
        logits = self.compute_logits(draft_hidden.flatten(0, 1))  # (B * num_drafts, vocab)
        logits = logits.view(ids.shape[0], num_drafts, -1)
        head = self.model.markov_head
        if head is not None:
            prev_embeds, drawn = markov_stage(head, logits, draft_hidden, ids[:, 0], sampling)
            return logits, draft_hidden, prev_embeds, drawn
        return logits, draft_hidden, None, None if sampling is None else draw_slots(logits, sampling)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden) final draft hidden states -> (n, vocab) float32 logits: the target's LM head, then the
        checkpoint's `output_multiplier` and `final_logit_softcapping` (z-lab's `compute_logits`)."""
        logits = self._target.compute_logits(hidden) * self.config.output_multiplier
        softcap = self.config.final_logit_softcapping
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    def _check_query(self, query: DraftQuery) -> int:
        """The query's max_drafts, after refusing what cannot be served."""
        if not 0 <= query.max_drafts <= self.num_spec_tokens:
            raise ValueError(
                f"max_drafts must be in [0, num_spec_tokens={self.num_spec_tokens}], got {query}"
            )
        if query.position < 0:
            raise ValueError(f"position must be >= 0, got {query}")
        if not 0 <= query.current_token < self.config.layers.vocab_size:
            raise ValueError(f"current_token {query.current_token} is outside the vocabulary")
        self._check_blocks(query.block_ids, query.position)
        return query.max_drafts

    def _check_blocks(self, block_ids: list[int], num_positions: int) -> None:
        if len(block_ids) * self.page_size < num_positions:
            raise ValueError(
                f"{len(block_ids)} blocks of {self.page_size} cannot hold {num_positions} positions"
            )
        if block_ids and (min(block_ids) < 0 or max(block_ids) >= self.num_pages):
            raise ValueError(f"block ids must be in [0, {self.num_pages}), got {block_ids}")
