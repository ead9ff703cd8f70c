"""The geometry of a model's KV pages and of a hybrid model's state slots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from openinfer.engine_core.models.config import ModelConfig


def page_bytes(model: ModelConfig, block_size: int, dtype: torch.dtype, kv_heads: int | None = None) -> int:
    """Bytes one page of ``block_size`` tokens takes across ``model``'s layers (keys and values): a target's
    KV block, or a drafter's context-cache page. ``kv_heads``: the KV heads a page holds, when not all the
    model's (a tensor-parallel rank's, `tensor_parallel.kv_heads_per_rank`)."""
    heads = model.num_key_value_heads if kv_heads is None else kv_heads
    per_token = 2 * model.num_kv_layers * heads * model.head_dim
    return per_token * block_size * dtype.itemsize


@dataclass(frozen=True)
class StateGeometry:
    """A hybrid model's state slots (Qwen3.5's Gated DeltaNet layers): each running request holds a group of
    `group_size` consecutive slots (1 + the most drafts a step verifies: a verification keeps the state
    after each of its tokens, and the next step starts from the accepted one); group g is slots
    g * group_size ... (g + 1) * group_size - 1. With prefix caching, `num_prefix_slots` more slots past the
    groups keep the state at cached positions (multiples of `prefix_interval` tokens, themselves multiples of
    the block size) for later requests with the same prefix to start from. One more slot past them all is
    the padding steps' scratch."""

    num_groups: int  # requests that can hold state at once (the KV manager hands groups out)
    group_size: int  # slots per group
    num_prefix_slots: int = (
        0  # states kept for prefix-cache hits (0: a hybrid model's prefixes are not cached)
    )
    prefix_interval: int = 0  # tokens between two positions whose state may be kept (0 with no prefix slots)

    def __post_init__(self) -> None:
        if self.num_groups < 1 or self.group_size < 1:
            raise ValueError(
                f"a hybrid model needs at least one state group of at least one slot, got {self.num_groups} "
                f"groups of {self.group_size}: raise --kv-cache-gb (or --gpu-memory-utilization)"
            )
        if (self.num_prefix_slots > 0) != (self.prefix_interval > 0) or self.num_prefix_slots < 0:
            raise ValueError(f"prefix state slots need an interval and the other way round: {self}")

    @property
    def num_slots(self) -> int:
        """Slots in all, the scratch slot included."""
        return self.num_groups * self.group_size + self.num_prefix_slots + 1

    def prefix_slot(self, index: int) -> int:
        """The slot of prefix state `index` (0 <= index < num_prefix_slots)."""
        return self.num_groups * self.group_size + index

    @property
    def scratch_slot(self) -> int:
        return self.num_slots - 1
