"""Paged KV-cache blocks with automatic prefix caching: the scheduler asks, this answers and allocates.

A request's block table is a list of block ids: position ``p`` lives in block ``block_ids[p // block_size]``
at offset ``p % block_size``. Blocks are reference-counted, so running requests can share them.

Prefix caching has vLLM's semantics, so the numbers agree:

- Only full blocks are cached, each keyed by a hash chained over its parent block's key and its own token ids
  (SHA-256: a key names its whole prefix). A block is cached when the step that computes its last token is
  scheduled. Drafts are never part of a request's tokens: a block holding draft slots is cached only once
  they are verified (an accepted draft's keys and values are the ones its token has) and scheduled past.
- A request admitted from the queue takes the longest chain of cached blocks that ends before its last
  token (the last token is always computed, for its logits) and computes the rest.
- A block nobody holds any more stays cached in the free queue until it is reused, least recently freed
  first; blocks that are not cached are reused before any cached one.
- A key names the first block cached under it while that block can be hit (vLLM keeps the first); a block
  computed again under the same key replaces it only when the old one is no hit (see the drafter below).
- Whatever else a block id holds beside the target's KV (a DFlash drafter keeps its context keys and values
  in the same block ids) is not this manager's to know: a ``hit_filter`` predicate, when set, says which
  cached blocks may serve a hit (the drafter's own record of the blocks whose context it wrote); where it
  says no, the chain stops there and the request computes the rest.
- A hybrid model's requests also hold a state group each (``num_state_groups`` of them, see StateGeometry):
  taken at admission (no free group, no admission), given back when the request lets go of its blocks. Its
  prefix hits need the state after the prefix too (``PrefixStates``, prefix_states.py): a hit is cut back
  to the longest cached prefix whose state is kept, and a step running a request past a position whose state
  may be kept stores it (``plan_state_captures``, then ``commit_state_captures`` once the step has run).
- Queries and hits are counted in tokens when a request is admitted for the first time (never again after a
  preemption): ``counters``, cumulative for the engine's life, None when caching is off.
- With an ``event_log`` (``--kv-events-config``), every change of the set of cached keys is recorded there as
  vLLM's KV events, in order (kv_event_log.py).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from openinfer.engine_core.config import check_kv_geometry
from openinfer.engine_core.core.kv_event_log import KVEventLog
from openinfer.engine_core.core.prefix_states import PrefixStates
from openinfer.engine_core.request import Request
from openinfer.protocol import PrefixCacheCounters


class PrefixHit(NamedTuple):
    """The cached blocks a waiting request would start from (``lookup``), handed back to ``admit``."""

    blocks: tuple[int, ...]
    num_tokens: int  # the tokens they hold: the request computes from here on
    state: int | None = None  # a hybrid model's prefix state slot holding the state after them


NO_HIT = PrefixHit((), 0)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        num_state_groups: int = 0,
        prefix_states: PrefixStates | None = None,
    ) -> None:
        check_kv_geometry(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # reused from the front
        self._refs = [0] * num_blocks
        self._key_of: list[bytes | None] = [None] * num_blocks  # a cached block's key ...
        self._cached: dict[bytes, int] = {}  # ... and the block of each key: one is set iff the other is
        # Which cached blocks may serve a hit (None: every one); set by whoever keeps more in the block ids.
        self.hit_filter: Callable[[int], bool] | None = None
        self.enable_caching = enable_caching
        self.counters = PrefixCacheCounters() if enable_caching else None
        self.num_state_groups = num_state_groups  # 0: the model keeps no state beside its KV
        self._free_groups = list(range(num_state_groups - 1, -1, -1))  # popped from the end: 0 first
        # a hybrid model's kept prefix states (None: its prefixes are never hit)
        self.prefix_states = prefix_states if enable_caching and num_state_groups else None
        # the cache's changes as KV events, when someone publishes them (None: not recorded)
        self.event_log: KVEventLog | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_used_state_groups(self) -> int:
        return self.num_state_groups - len(self._free_groups)

    @property
    def num_busy_blocks(self) -> int:
        """The used blocks as the load snapshot reports them: for a hybrid model, whose requests also hold
        state groups, the larger of the used blocks and the same share of the blocks as of the groups (the
        groups may run out first: a full engine then reads as full)."""
        if not self.num_state_groups:
            return self.num_used_blocks
        groups_share = -(-self.num_used_state_groups * self.num_blocks // self.num_state_groups)
        return max(self.num_used_blocks, groups_share)

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` slots."""
        return -(-num_tokens // self.block_size)

    # ---- admission ----

    def lookup(self, request: Request) -> PrefixHit:
        """The longest chain of cached blocks ``request`` can start from, ending before its last token."""
        if not self.enable_caching:
            return NO_HIT
        blocks: list[int] = []
        num_blocks = (request.num_tokens - 1) // self.block_size
        keys = self._keys(request, num_blocks)
        for i in range(num_blocks):
            block = self._cached.get(keys[i])
            if block is None or not self._is_hit(block):
                break
            blocks.append(block)
        if self.num_state_groups:  # a hybrid model: only as far as a kept state
            found = (
                None
                if self.prefix_states is None
                else self.prefix_states.find(keys, len(blocks), self.block_size)
            )
            if found is None:
                return NO_HIT
            num_hit, state = found
            return PrefixHit(tuple(blocks[:num_hit]), num_hit * self.block_size, state)
        return PrefixHit(tuple(blocks), len(blocks) * self.block_size)

    def admit(self, request: Request, hit: PrefixHit, num_new_tokens: int, counted: bool) -> bool:
        """Give a waiting request the blocks of ``hit`` and blocks for ``num_new_tokens`` more tokens, and
        count the lookup when ``counted`` (its first admission); False (nothing changed) when blocks run out."""
        assert not request.block_ids, "a waiting request holds no blocks"
        needed = self.num_blocks_for(hit.num_tokens + num_new_tokens) - len(hit.blocks)
        idle_hits = sum(1 for block in hit.blocks if self._refs[block] == 0)  # counted in the free queue
        if needed + idle_hits > len(self._free) or (self.num_state_groups and not self._free_groups):
            return False
        if self.num_state_groups:
            request.state_group = self._free_groups.pop()
            request.prefix_state = hit.state
        for block in hit.blocks:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
        request.block_ids.extend(hit.blocks)
        request.block_ids.extend(self._take_free() for _ in range(needed))
        request.num_cached_blocks = len(hit.blocks)
        if self.counters is not None and counted:
            self.counters.record(request.num_tokens, hit.num_tokens)
        return True

    # ---- running requests ----

    def allocate(self, request: Request, num_slots: int) -> bool:
        """Grow the request's blocks to cover ``num_slots`` slots; False (no change) if blocks run out."""
        block_ids = request.block_ids
        if num_slots <= len(block_ids) * self.block_size:  # the common case: nothing to allocate
            return True
        needed = self.num_blocks_for(num_slots) - len(block_ids)
        if needed > len(self._free):
            return False
        block_ids.extend(self._take_free() for _ in range(needed))
        return True

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's full blocks among its first ``num_tokens`` tokens (scheduled this step: their
        keys and values are written before anything reads them). A key already naming a block that can be
        hit keeps it."""
        full = num_tokens // self.block_size
        if not self.enable_caching or full <= request.num_cached_blocks:  # the common case: none new
            return
        keys = self._keys(request, full)
        new_run: int | None = None  # the first of the blocks just cached whose keys are new to the cache
        for i in range(request.num_cached_blocks, full):
            block, key = request.block_ids[i], keys[i]
            previous = self._cached.get(key)
            if previous is not None:
                self._stored(request, new_run, i)
                new_run = None
                if self._is_hit(previous):
                    continue
                self._key_of[previous] = None  # the key moves to this block: no change of the set
            elif new_run is None:
                new_run = i
            self._cached[key] = block
            self._key_of[block] = key
        self._stored(request, new_run, full)
        request.num_cached_blocks = full

    def trim(self, request: Request, num_tokens: int) -> bool:
        """Free the blocks past those holding ``num_tokens`` slots (rolling back rejected draft positions,
        never cached); True when there were any."""
        block_ids = request.block_ids
        if len(block_ids) * self.block_size < num_tokens + self.block_size:  # the common case: none
            return False
        keep = self.num_blocks_for(num_tokens)
        for block in block_ids[keep:]:
            self._release(block)
        del block_ids[keep:]
        return True

    def free(self, request: Request) -> None:
        """Let go of every block of the request (last first, so its tail is reused before its head) and
        empty its table; cached blocks stay cached until reused."""
        for block in reversed(request.block_ids):
            self._release(block)
        request.block_ids.clear()
        request.num_cached_blocks = 0
        if request.state_group is not None:
            self._free_groups.append(request.state_group)
            request.state_group = None
            request.prefix_state = None

    # ---- a hybrid model's prefix states ----

    def begin_step(self) -> None:
        """A step is being decided: the prefix states the last one read or wrote are no longer pinned."""
        if self.prefix_states is not None:
            self.prefix_states.unpin_all()

    def plan_state_captures(self, request: Request, start: int, num_new: int) -> tuple[tuple[int, int], ...]:
        """The (position, prefix state slot) pairs where a step running ``num_new`` of the request's tokens
        from ``start`` keeps the state after position - 1 (position a multiple of the interval, its prefix's
        state not kept yet, a slot to spare)."""
        if self.prefix_states is None:
            return ()
        captures = []
        for position in self.prefix_states.positions(start, start + num_new):
            key = self._keys(request, position // self.block_size)[position // self.block_size - 1]
            slot = self.prefix_states.plan(key)
            if slot is not None:
                captures.append((position, slot))
        return tuple(captures)

    def commit_state_captures(self, request: Request, captures: tuple[tuple[int, int], ...]) -> None:
        """The step that stored these states has run: they serve hits from now on."""
        if self.prefix_states is not None:
            for position, slot in captures:
                self.prefix_states.commit(request.prefix_keys[position // self.block_size - 1], slot)

    def reset(self) -> None:
        """Forget every cached block (a step failed: what it wrote is unknown)."""
        for block in self._cached.values():
            self._key_of[block] = None
        self._cached.clear()
        if self.event_log is not None:
            self.event_log.cleared()
        if self.prefix_states is not None:
            self.prefix_states.reset()

    # ---- internals ----

    def _is_hit(self, block: int) -> bool:
        """Whether a cached block serves a lookup now: always, unless the hit filter says no."""
        return self.hit_filter is None or self.hit_filter(block)

    def _keys(self, request: Request, num_blocks: int) -> list[bytes]:
        """The request's block keys, at least its first ``num_blocks`` (computed once, kept on the request:
        its tokens never change)."""
        keys, tokens, size = request.prefix_keys, request.all_token_ids, self.block_size
        for i in range(len(keys), num_blocks):
            parent = keys[i - 1] if i else b""
            keys.append(
                hashlib.sha256(parent + array("q", tokens[i * size : (i + 1) * size]).tobytes()).digest()
            )
        return keys

    def _stored(self, request: Request, first: int | None, last: int) -> None:
        """Record blocks ``first .. last - 1`` of the request as newly cached (none when ``first`` is None)."""
        if self.event_log is not None and first is not None and first < last:
            self.event_log.stored(request.prefix_keys, first, last, request.all_token_ids)

    def _take_free(self) -> int:
        """The block at the front of the free queue, out of the cache if it was cached."""
        block, _ = self._free.popitem(last=False)
        key = self._key_of[block]
        if key is not None:
            del self._cached[key]
            self._key_of[block] = None
            if self.event_log is not None:
                self.event_log.removed(key)
        self._refs[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free[block] = None  # a cached block joins the back: reused last
            if self._key_of[block] is None:
                self._free.move_to_end(block, last=False)  # an uncached one is reused first
