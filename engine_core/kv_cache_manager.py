"""Paged KV-cache block allocation: the scheduler asks, this answers and allocates."""

from __future__ import annotations

from collections import deque


class KVCacheManager:
    """A free list of fixed-size KV blocks; a request's block table is a list of block ids.

    Position ``p`` of a request lives in block ``block_ids[p // block_size]`` at offset ``p % block_size``.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need at least one KV block of at least one slot, got {num_blocks}x{block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` slots."""
        return -(-num_tokens // self.block_size)

    def allocate(self, block_ids: list[int], num_tokens: int) -> bool:
        """Grow ``block_ids`` in place to cover ``num_tokens`` slots; False (no change) if blocks run out."""
        if num_tokens <= len(block_ids) * self.block_size:  # the common case: nothing to allocate
            return True
        needed = self.num_blocks_for(num_tokens) - len(block_ids)
        if needed > len(self._free):
            return False
        for _ in range(max(needed, 0)):
            block_ids.append(self._free.popleft())
        return True

    def trim(self, block_ids: list[int], num_tokens: int) -> bool:
        """Free the blocks past those holding ``num_tokens`` slots (rolling back rejected draft positions);
        True when there were any."""
        if len(block_ids) * self.block_size < num_tokens + self.block_size:  # the common case: none
            return False
        keep = self.num_blocks_for(num_tokens)
        self._free.extend(block_ids[keep:])
        del block_ids[keep:]
        return True

    def free(self, block_ids: list[int]) -> None:
        """Return every block of a table to the free list and empty the table."""
        self._free.extend(block_ids)
        block_ids.clear()
