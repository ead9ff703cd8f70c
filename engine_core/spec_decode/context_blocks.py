"""A context-reading drafter's own record of which KV blocks hold its context, handed to the KV manager as
its hit filter (the KV manager knows nothing of drafters).

A DFlash drafter keeps its context keys and values in the target's block ids. A cached block may serve a
prefix hit for it only if the drafter's context there is that of the tokens the target's KV holds there:
the drafter wrote it for every position of the block, and the target has written nothing there since. The
drafter learns both from each step's decision: every position a step runs is written by the target; the
verified ones of a request the drafter drafts for get its context too.
"""

from __future__ import annotations


class ContextBlocks:
    """The full blocks whose drafter context matches the target's KV (``holds`` is the hit filter)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: set[int] = set()

    def holds(self, block: int) -> bool:
        return block in self._blocks

    def target_wrote(self, block_ids: list[int], start: int, end: int) -> None:
        """The target wrote its KV at positions [start, end) of the request with ``block_ids``, and the drafter
        no context there: the blocks holding them no longer match."""
        size = self.block_size
        self._blocks.difference_update(block_ids[start // size : -(-end // size)])

    def drafter_wrote(self, block_ids: list[int], start: int, end: int) -> None:
        """The drafter wrote its context at positions [start, end), and at every position before them: the full
        blocks among them match (a block it wrote in part, its last, does not yet)."""
        size = self.block_size
        self._blocks.update(block_ids[start // size : end // size])
