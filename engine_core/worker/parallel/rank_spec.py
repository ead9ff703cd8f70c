"""What a tensor-parallel rank process is told at start (:class:`RankSpec`, JSON on its command line), and how
every rank, the driver included, joins the engine's process groups."""

from __future__ import annotations

import ctypes
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta

import msgspec
import torch
import torch.distributed as dist

from openinfer.engine_core.models.kv_geometry import StateGeometry

RANK_MODULE = "openinfer.engine_core.worker.parallel.rank_worker"
# A rank waits this long for the driver's next header; the driver pings when idle far more often (PING_S).
CONTROL_TIMEOUT = timedelta(days=1)
PING_S = 60.0  # seconds without a header after which an idle driver sends a PING
_PR_SET_PDEATHSIG = 1  # prctl(2)


class RankSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One rank's runner and place in the group: the engine's flags that shape the model, resolved."""

    engine_index: int  # for the log lines
    rank: int  # 1 .. world_size - 1 (the driver is rank 0)
    world_size: int  # --tensor-parallel-size
    init_address: str  # tcp://127.0.0.1:PORT, the group's rendezvous
    parent_pid: int  # the driver's pid: a rank whose parent is gone exits
    model_path: str
    device: str  # torch's spelling: cpu, cuda:N
    dtype: str  # torch's dtype name: float32, bfloat16, float16
    num_kv_blocks: int  # the driver's KV sizing, the same on every rank
    block_size: int
    attention_backend: str
    enforce_eager: bool
    max_num_seqs: int
    num_threads: int  # torch CPU threads of this rank
    rank_timeout: float  # seconds a collective inside a step may wait (--rank-timeout)
    log_level: str
    enable_expert_parallel: bool = False  # a MoE model's experts split whole over the ranks
    # a hybrid model's state slots as the driver sized them, the same on every rank (None: no state)
    state_geometry: StateGeometry | None = None

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, text: str) -> RankSpec:
        return msgspec.json.decode(text, type=cls)

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype)
        assert isinstance(dtype, torch.dtype), self.dtype
        return dtype


@dataclass(frozen=True)
class RankGroups:
    """The engine's process groups, on every rank: ``control`` carries the step headers (no timeout worth the
    name: a rank waits there while the engine is idle), ``data`` the step payloads (``--rank-timeout``), and
    ``model`` the sharded model's collectives (gloo on the CPU: ``data`` itself; NCCL on CUDA)."""

    control: dist.ProcessGroup
    data: dist.ProcessGroup
    model: dist.ProcessGroup


def join_groups(
    init_address: str, rank: int, world_size: int, device: str, rank_timeout: float
) -> RankGroups:
    """Join the engine's group as ``rank`` (blocks until every rank has) and make its three groups."""
    dist.init_process_group(
        "gloo", init_method=init_address, rank=rank, world_size=world_size, timeout=CONTROL_TIMEOUT
    )
    control = dist.group.WORLD
    assert control is not None
    ranks = list(range(world_size))
    timeout = timedelta(seconds=rank_timeout)
    data = dist.new_group(ranks, timeout=timeout, backend="gloo")
    model = data
    if device.startswith("cuda"):  # untested here (no GPU): NCCL for the model's all-reduces
        torch.cuda.set_device(torch.device(device))
        model = dist.new_group(ranks, timeout=timeout, backend="nccl")
    return RankGroups(control, data, model)


def leave_groups() -> None:
    """Destroy the process groups (a process that exits with gloo's still up aborts in its destructors)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def die_with_parent() -> None:
    """In a rank before it execs (Linux): SIGKILL it when the driver's thread that started it dies, so that
    a SIGKILLed engine leaves no rank behind."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
