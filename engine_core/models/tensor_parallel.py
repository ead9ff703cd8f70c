"""A rank's place in a tensor-parallel group: which slice of each sharded dimension it holds, and the two
collectives the sharded layers call (an all-reduce after a row-parallel matmul, an all-gather of the
vocab-parallel logits), as plain torch.distributed calls.

KV heads split over the ranks like the query heads; with fewer KV heads than ranks each is replicated on
world / num_kv_heads consecutive ranks (vLLM's rule): rank r holds KV head r // (world / num_kv_heads), which
is the head its query heads read under grouped-query attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Shard:
    """Entries start .. start + size - 1 of a checkpoint dimension of ``total`` entries: a rank's slice."""

    start: int
    size: int
    total: int

    def __post_init__(self) -> None:
        if not (0 <= self.start and 0 < self.size and self.start + self.size <= self.total):
            raise ValueError(f"a shard must lie inside its dimension: {self}")

    @property
    def whole(self) -> bool:
        """Whether the shard is the whole dimension (one rank, or a replicated tensor)."""
        return self.size == self.total

    @property
    def slice(self) -> slice:
        return slice(self.start, self.start + self.size)

    def scaled(self, width: int) -> Shard:
        """The same shard counted in units ``width`` entries wide: heads -> their columns (``width`` head_dim)."""
        return Shard(self.start * width, self.size * width, self.total * width)


@dataclass(frozen=True)
class TensorParallel:
    """Rank ``rank`` of ``world_size`` ranks that run one model sharded. ``group`` is the torch.distributed
    process group the collectives run in (None: the default group; never used at one rank, where every
    collective is the identity and no call is made)."""

    rank: int  # 0 .. world_size - 1
    world_size: int  # ranks the model is split over (--tensor-parallel-size)
    group: dist.ProcessGroup | None = None  # the collectives' group; None: the default one (one rank: none)
    # --enable-expert-parallel: a MoE layer's experts split over the ranks whole (else each expert's width)
    expert_parallel: bool = False

    SINGLE: ClassVar[TensorParallel]  # one rank: the whole model, no collectives

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of {self.world_size} ranks is no tensor-parallel rank")

    @property
    def single(self) -> bool:
        """Whether this is the only rank (the unsharded model)."""
        return self.world_size == 1

    def describe(self) -> str:
        """'rank 1/2', as logs name it."""
        return f"rank {self.rank}/{self.world_size}"

    def shard(self, total: int, what: str) -> int:
        """This rank's count of ``total`` things split evenly over the ranks; ValueError naming the numbers
        (``what`` names the things: "attention heads") when the ranks do not divide them."""
        if total % self.world_size:
            raise ValueError(
                f"--tensor-parallel-size {self.world_size} does not divide the model's {total} {what}: choose "
                "a size that does"
            )
        return total // self.world_size

    def shard_range(self, total: int, what: str) -> Shard:
        """This rank's slice of ``total`` things split evenly over the ranks (see ``shard``)."""
        size = self.shard(total, what)
        return Shard(self.rank * size, size, total)

    def kv_heads(self, num_kv_heads: int) -> Shard:
        """This rank's KV heads: an even split when there are at least as many heads as ranks, else the one
        head it shares with world / num_kv_heads - 1 other ranks (see the module's docstring)."""
        if num_kv_heads >= self.world_size:
            return self.shard_range(num_kv_heads, "KV heads")
        if self.world_size % num_kv_heads:
            raise ValueError(
                f"--tensor-parallel-size {self.world_size} is not a multiple of the model's {num_kv_heads} KV "
                "heads: with fewer KV heads than ranks, each head is replicated on the same number of ranks"
            )
        return Shard(self.rank // (self.world_size // num_kv_heads), 1, num_kv_heads)

    def experts(self, num_experts: int) -> Shard:
        """This rank's experts of a MoE layer: E / N whole experts under expert parallelism (refused, naming
        the numbers, when N does not divide them), else every expert (each split by its width)."""
        if not self.expert_parallel:
            return Shard(0, num_experts, num_experts)
        return self.shard_range(num_experts, "experts (--enable-expert-parallel gives each rank whole ones)")

    def expert_width(self, width: int) -> Shard:
        """This rank's slice of each expert's intermediate width: whole under expert parallelism, else split
        like a dense MLP's (see ``shard``)."""
        if self.expert_parallel:
            return Shard(0, width, width)
        return self.shard_range(width, "expert MLP columns (moe_intermediate_size)")

    def all_reduce(self, x: Tensor) -> Tensor:
        """x summed over the ranks, in place; x itself at one rank."""
        if not self.single:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: Tensor) -> Tensor:
        """(..., d) on each rank -> (..., world_size * d): the ranks' shards side by side in rank order; x
        itself at one rank."""
        if self.single:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]  # world x (..., d)
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)  # (..., world * d)


TensorParallel.SINGLE = TensorParallel(0, 1, None)


def kv_heads_per_rank(num_kv_heads: int, world_size: int) -> int:
    """The KV heads each of ``world_size`` ranks holds (every rank as many; see the module's docstring), what
    a rank's KV page is sized by; ValueError as `TensorParallel.kv_heads` when the ranks cannot hold them."""
    return TensorParallel(0, world_size).kv_heads(num_kv_heads).size
