"""The memory a block drafter takes: counted before anything of it is allocated, the budget it must fit, and
its allocations once it fits (its model, loaded: ``load_within_budget``; its context caches).

Counted from its model built on the meta device (its parameters at the engine's dtype), its context cache
(one page per target KV block, per draft layer) and its RoPE table. Two bounds:

- its parameters weigh no more than its target's, or ``SMALL_DRAFTER_BYTES`` when that is more. A drafter is
  a small fraction of its target (z-lab's and DeepSpec's: a few percent to ~15 %): one as heavy drafts no
  faster than the target decodes, so the bound refuses nothing useful, and it stops a folder whose shapes
  each pass ``models/drafter_fit.py`` but together make tens of gigabytes. The floor is for toy targets,
  which a test drafter may outweigh (a Markov head of the vocabulary's rank over a 3-layer target); no
  machine that serves is threatened by 256 MiB.
- all it allocates fits in the memory free now: on CUDA what the driver reports free plus what torch's
  allocator holds unused; on the CPU the kernel's MemAvailable (and the cgroup's headroom, in a container). A
  drafter loaded at run time goes into an engine sized without it: one that does not fit would fail
  half-allocated on CUDA, and on the CPU swap or get the engine OOM-killed; it is refused instead, saying
  what it needs and what is free. (At start, the CUDA KV cache is sized with the drafter's weights and pages
  counted, so what is free then holds it.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from openinfer.engine_core.models.block_attention import BlockAttention
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.kv_geometry import page_bytes
from openinfer.engine_core.models.packed_linear import pack_modules_for_cpu
from openinfer.engine_core.spec_decode.drafter import DraftTarget
from openinfer.kernels.cpu_matmul import cpu_packing_available

GIB = 2**30
SMALL_DRAFTER_BYTES = 256 * 2**20  # the parameter budget of a drafter beside a toy target (see above)
_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class DrafterMemory:
    """What a drafter will hold on its device, in bytes."""

    parameters: int  # its parameters at the engine's dtype
    context_cache: int  # draft layers x (keys, values) x pages x page x kv heads x head_dim, at the dtype
    rope_table: int  # positions x (cos, sin) x head_dim, float32 while it is built

    @property
    def total(self) -> int:
        return self.parameters + self.context_cache + self.rope_table

    def check(self, target_weights: int, free: int | None) -> None:
        """Refuse a drafter heavier than ``target_weights`` bytes (or SMALL_DRAFTER_BYTES when that is more),
        or whose allocations do not fit in ``free`` bytes (None: unknown, not checked)."""
        limit = max(target_weights, SMALL_DRAFTER_BYTES)
        if self.parameters > limit:
            raise ValueError(
                f"the drafter's parameters take {self.parameters / GIB:.3f} GiB, more than its target's "
                f"{target_weights / GIB:.3f} GiB (or {SMALL_DRAFTER_BYTES / GIB:.2f} GiB beside a small target): "
                "a drafter is a small fraction of its target"
            )
        if free is not None and self.total > free:
            raise ValueError(
                f"the drafter needs {self.total / GIB:.3f} GiB (parameters {self.parameters / GIB:.3f}, "
                f"context cache {self.context_cache / GIB:.3f}, RoPE table {self.rope_table / GIB:.3f}) but "
                f"only {free / GIB:.3f} GiB are free: start the engine with this drafter (its KV cache is then "
                "sized for both), or free memory"
            )


def drafter_memory(
    model: nn.Module,
    layers: ModelConfig,
    num_pages: int,
    page_size: int,
    max_positions: int,
    dtype: torch.dtype,
) -> DrafterMemory:
    """The memory of ``model`` (built on the meta device: shapes only) with draft layers ``layers``, a context
    cache of ``num_pages`` pages of ``page_size`` and a RoPE table of ``max_positions``, at ``dtype``."""
    parameters = sum(param.numel() for param in model.parameters()) * dtype.itemsize
    return DrafterMemory(
        parameters=parameters,
        context_cache=num_pages * page_bytes(layers, page_size, dtype),
        rope_table=max_positions * 2 * layers.head_dim * 4,
    )


def weight_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters as they are held."""
    return sum(param.numel() * param.element_size() for param in model.parameters())


def free_memory(device: torch.device) -> int | None:
    """Bytes that can be allocated on ``device`` now; None where it cannot be told."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    limits = [n for n in (_mem_available(), _cgroup_headroom()) if n is not None]
    return min(limits) if limits else None


def _mem_available() -> int | None:
    """The kernel's MemAvailable (Linux), in bytes."""
    try:
        lines = _MEMINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_headroom() -> int | None:
    """What this process's cgroup (v2) may still take before its limit; None without a limit."""
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((_CGROUP / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def load_within_budget(
    path: Path, config: DFlashConfig, attention: BlockAttention, target: DraftTarget, max_positions: int
) -> DFlashDraftModel:
    """The drafter's model in eval mode on the target's device and dtype, its weights loaded from ``path``:
    built on the meta device first, and allocated only once the files hold what the config says
    (``check_checkpoint``, from the headers) and what it will hold fits (:meth:`DrafterMemory.check`)."""
    with torch.device("meta"):  # no throwaway random init; load_weights fills every parameter
        model = DFlashDraftModel(config, attention, max_positions)
    model.check_checkpoint(path)
    memory = drafter_memory(
        model, config.layers, target.num_kv_blocks, target.block_size, max_positions, target.dtype
    )
    memory.check(weight_bytes(target.model), free_memory(target.device))
    model = model.to(target.dtype).to_empty(device=target.device).eval()
    model.load_weights(path)
    pack = target.device.type == "cpu" and cpu_packing_available(target.dtype)  # as the target's are
    if pack:
        pack_modules_for_cpu(model)
    model.fuse_context(pack)
    return model


def context_caches(layers: ModelConfig, target: DraftTarget) -> Tensor:
    """The draft layers' context caches, zeroed, in one tensor (num_layers, 2, num_pages, page_size,
    num_kv_heads, head_dim), a page per target KV block; ValueError when they do not fit."""
    shape = (2, target.num_kv_blocks, target.block_size, layers.num_key_value_heads, layers.head_dim)
    try:
        caches = torch.zeros((layers.num_hidden_layers, *shape), dtype=target.dtype, device=target.device)
    except torch.OutOfMemoryError as e:  # loaded at run time into an engine sized without it
        raise ValueError(
            f"the drafter's context cache for {target.num_kv_blocks} KV blocks does not fit on {target.device}: "
            "start the engine with this drafter (its KV cache is then sized for both) or lower the target's share"
        ) from e
    return caches
