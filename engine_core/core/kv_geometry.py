"""The one check of a KV cache's geometry, shared by the flags, the runners and the KV-cache manager."""

from __future__ import annotations


def check_kv_geometry(num_kv_blocks: int, block_size: int) -> None:
    """Refuse a KV cache without a block, or blocks without a slot, saying which flags set them."""
    if num_kv_blocks < 1 or block_size < 1:
        raise ValueError(
            "a KV cache needs at least one block of at least one slot: --num-kv-blocks (or the memory "
            f"--kv-cache-gb buys) and --block-size must be >= 1, got {num_kv_blocks} blocks of {block_size}"
        )
