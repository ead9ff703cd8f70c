"""A hybrid model's prefix cache of states: the state after a cached prefix, kept in one of a fixed number of
prefix slots, for a later request with that prefix to start from (its KV comes from the cached blocks).

vLLM's "align" mode, in openinfer's terms: a state is kept only at positions that are multiples of the
interval (a whole number of blocks), keyed by the key of the block that ends there, which names the whole
prefix (kv_cache_manager.py). A step that runs a request past such a position stores the state there
(``plan``: a slot is taken then, from the free ones or the least recently used entry); the entry serves hits
once the step has run (``commit``); until then, and while a step that reads it is being decided, the slot is
pinned: nothing else takes it. Only tokens that are the request's own are kept, never drafts: a position
reached by accepted drafts keeps no state (the next one reached by a new token or a prompt chunk does).
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixStates:
    def __init__(self, num_slots: int, interval: int) -> None:
        self.num_slots = num_slots
        self.interval = interval  # tokens between positions whose state may be kept
        self._entries: OrderedDict[bytes, int] = OrderedDict()  # key -> slot, least recently used first
        self._key_of: dict[int, bytes] = {}  # slot -> key, for the slots in _entries
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._pinned: set[int] = set()  # slots a step being decided reads or writes

    def unpin_all(self) -> None:
        """A new step is being decided: the last one's reads and writes are done."""
        self._pinned.clear()

    def find(self, keys: list[bytes], num_blocks: int, block_size: int) -> tuple[int, int] | None:
        """The longest prefix of at most ``num_blocks`` blocks (``keys`` theirs) whose state is kept: (its
        blocks, its slot), the slot pinned for the step being decided; None when no such prefix is kept."""
        step = self.interval // block_size  # blocks per interval
        for blocks in range(num_blocks - num_blocks % step, 0, -step):
            slot = self._entries.get(keys[blocks - 1])
            if slot is not None:
                self._entries.move_to_end(keys[blocks - 1])
                self._pinned.add(slot)
                return blocks, slot
        return None

    def positions(self, start: int, end: int) -> range:
        """The positions in (start, end] whose state may be kept: the state after token position - 1."""
        first = (start // self.interval + 1) * self.interval
        return range(first, end + 1, self.interval)

    def plan(self, key: bytes) -> int | None:
        """A slot for the state of the prefix ``key`` names, pinned until the step has run; None when that
        state is kept already or every slot is pinned."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return None
        if self._free:
            slot = self._free.pop()
        else:
            victim = next((k for k, s in self._entries.items() if s not in self._pinned), None)
            if victim is None:
                return None
            slot = self._entries.pop(victim)
            del self._key_of[slot]
        self._pinned.add(slot)
        return slot

    def commit(self, key: bytes, slot: int) -> None:
        """The step that stored ``key``'s state in ``slot`` has run: it serves hits from now on."""
        previous = self._entries.pop(key, None)  # stored twice in one step: keep the later slot
        if previous is not None and previous != slot:
            del self._key_of[previous]
            self._free.append(previous)
        self._entries[key] = slot
        self._key_of[slot] = key

    def reset(self) -> None:
        """Forget every kept state and every planned store (a step failed: what it wrote is unknown)."""
        self._entries.clear()
        self._key_of.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))
        self._pinned.clear()
