"""The prefix cache's changes as vLLM's KV events, recorded in the order they happen (``--kv-events-config``).

The KV-cache manager tells this log each change of its set of cached keys: blocks that became cached, keys
that left it (an evicted block), the whole cache forgotten. The engine process takes the events after each
step and publishes them (kv_event_publisher.py). Replaying every event in order gives exactly the manager's
set of cached keys; a key that moves to another block (the first block under it could no longer be hit) stays
in the set and makes no event.
"""

from __future__ import annotations

from openinfer.protocol.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    external_block_hash,
)


class KVEventLog:
    """Events since the last :meth:`take`, oldest first."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._events: list[KVEvent] = []

    def stored(self, keys: list[bytes], first: int, last: int, token_ids: list[int]) -> None:
        """Blocks ``first .. last - 1`` of a request became cached (``keys``: the request's block keys,
        ``token_ids``: its tokens)."""
        size = self.block_size
        self._events.append(
            BlockStored(
                block_hashes=[external_block_hash(key) for key in keys[first:last]],
                parent_block_hash=external_block_hash(keys[first - 1]) if first else None,
                token_ids=token_ids[first * size : last * size],
                block_size=size,
                lora_id=None,
                medium=MEDIUM_GPU,
                lora_name=None,
            )
        )

    def removed(self, key: bytes) -> None:
        """A key left the cache (its block is reused): joins the last event when that was a removal too."""
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.append(external_block_hash(key))
        else:
            self._events.append(BlockRemoved([external_block_hash(key)], MEDIUM_GPU))

    def cleared(self) -> None:
        self._events.append(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        """The events since the last call, oldest first; the log is empty after."""
        events, self._events = self._events, []
        return events
