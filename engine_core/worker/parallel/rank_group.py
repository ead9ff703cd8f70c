"""The driver's side of a tensor-parallel engine: :class:`ParallelRunner`, the engine's model executor over N
rank processes (``--tensor-parallel-size N``).

The engine process is the driver and rank 0: it starts ranks 1 .. N-1 (``python -m`` :mod:`rank_worker`,
loopback only), all join one gloo group on 127.0.0.1, and each builds its shard's ``ModelRunner``. Each step
the driver broadcasts the step's decision once (:mod:`step_broadcast`: a header, then the payload), then every
rank runs it, the sharded layers' collectives inside; rank 0 returns the output and the engine reads it back.
A block drafter (DFlash, DSpark) runs on rank 0 alone: its embedding and LM head are rank 0's whole copy of
the target's (:mod:`draft_head`), loaded with the drafter, so drafting is never a collective.
A rank that dies, raises or keeps the others waiting past ``--rank-timeout`` ends the engine: the step raises
:class:`RankGroupFailure`, or, while the engine is idle, the watch thread finds the dead rank and exits.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec
import torch
import torch.distributed as dist
from torch import Tensor, nn

from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.worker.executor import ForwardOutput
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.parallel.draft_head import DraftHead
from openinfer.engine_core.worker.parallel.rank_spec import (
    PING_S,
    RANK_MODULE,
    RankGroups,
    RankSpec,
    die_with_parent,
    join_groups,
    leave_groups,
)
from openinfer.engine_core.worker.parallel.step_broadcast import (
    StepKind,
    StepMessage,
    bare_message,
    pack_step,
)
from openinfer.engine_core.worker.step_batch import StepBatch
from openinfer.engine_core.worker.step_graphs import StepGraphs
from openinfer.kernels.backend_name import BackendName

logger = logging.getLogger(__name__)
T = TypeVar("T")
_EXIT_WAIT_S = 10.0  # how long a stopping rank may take to exit before it is killed
_DEATH_WAIT_S = 1.0  # after a failed collective: how long a peer's exit may take to be seen


class RankGroupFailure(RuntimeError):
    """A rank of a tensor-parallel engine died, raised or hung past ``--rank-timeout``: the engine must end
    (its ranks are out of step with each other; no later step could run)."""


def init_address() -> str:
    """A rendezvous address on loopback: a port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class ParallelRunner:
    """The engine's :class:`~openinfer.engine_core.worker.executor.ModelExecutor` over ``spec.world_size``
    ranks: rank 0 (a ``ModelRunner`` in this process) and one child process per other rank, on ``devices``
    (one per rank, torch's spelling). :meth:`close` stops them; they are killed by pid on every other way
    out (an exception, ``sys.exit``), and die with this process if it is killed.

    It is also a block drafter's ``DraftTarget`` (rank 0's geometry, shard and aux hidden states, which are
    whole: each block's all-reduce leaves every rank the full hidden states), once :meth:`load_draft_head`
    has given rank 0 its copy of the embedding and LM head; the drafter drafts eagerly (no step graphs)."""

    def __init__(self, spec: RankSpec, devices: Sequence[str]) -> None:
        self.spec = spec
        self.ranks: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()  # held while a header (and its step) goes out: one sender at a time
        self._closed = threading.Event()
        self._failed = False
        self._ready = False
        self._last_sent = time.monotonic()
        atexit.register(self.close)  # whatever the way out (sys.exit, an exception): no rank outlives it
        try:
            for rank in range(1, spec.world_size):
                rank_spec = msgspec.structs.replace(spec, rank=rank, device=devices[rank])
                argv = [sys.executable, "-m", RANK_MODULE, rank_spec.encode()]
                self.ranks[rank] = subprocess.Popen(argv, preexec_fn=die_with_parent)
                logger.info("started rank %d of %d (pid %d)", rank, spec.world_size, self.ranks[rank].pid)
            self.groups = self._join()
            parallel = TensorParallel(0, spec.world_size, self.groups.model, spec.enable_expert_parallel)
            self.runner = ModelRunner(
                Path(spec.model_path), torch.device(devices[0]), spec.num_kv_blocks, spec.block_size,
                spec.torch_dtype, BackendName(spec.attention_backend), spec.enforce_eager,
                spec.max_num_seqs, spec.state_geometry, parallel=parallel,
            )  # fmt: skip
            self._guarded(lambda: dist.barrier(group=self.groups.control), "while the ranks loaded the model")
        except BaseException:
            self.close()
            raise
        self._ready = True
        runner = self.runner
        self.device, self.dtype, self.model_config = runner.device, runner.dtype, runner.model_config
        self.block_size, self.num_kv_blocks = runner.block_size, runner.num_kv_blocks
        self.state_geometry = runner.state_geometry
        self.attn_backend = runner.attn_backend
        self.step_graphs: StepGraphs | None = None  # a drafter's padded steps: none at N > 1
        self._draft_head: DraftHead | None = None
        pids = ", ".join(f"rank {r}: pid {p.pid}" for r, p in self.ranks.items())
        logger.info("tensor parallel over %d ranks (rank 0: this process; %s)", spec.world_size, pids)
        threading.Thread(target=self._watch, name="rank-watch", daemon=True).start()

    def warm_up(self, aux_layer_ids: Sequence[int] = ()) -> None:
        """Nothing to compile: ranks run eagerly (engine_cli.py warns when -O asked otherwise)."""

    def execute(self, step: StepBatch, aux_layer_ids: Sequence[int] = ()) -> ForwardOutput:
        """Send the step to every rank once, run rank 0's shard of it; the whole logits (every rank has them).
        RankGroupFailure when any rank cannot take part."""
        if self._failed or self._closed.is_set():
            raise RankGroupFailure("the engine's rank group has failed or stopped; no step can run")
        message = pack_step(step, aux_layer_ids)

        def run() -> ForwardOutput:
            with self._lock:
                self._send(message)
                return self.runner.execute(step, aux_layer_ids)

        return self._guarded(run, "during a step")

    @property
    def model(self) -> nn.Module:
        """Rank 0's shard of the target (a drafter weighs no more than its parameters)."""
        return self.runner.model

    def load_draft_head(self) -> DraftHead:
        """Rank 0's whole copy of the target's embedding and LM head for a drafter, read from the checkpoint
        (its two tensors only) the first time; held from then on."""
        if self._draft_head is None:
            runner = self.runner
            self._draft_head = DraftHead.load(
                Path(self.spec.model_path), runner.model_config, runner.device, runner.dtype
            )
        return self._draft_head

    def embed(self, token_ids: Tensor) -> Tensor:
        """(...,) int64 token ids -> (..., hidden) the target's embeddings, on rank 0 alone (the copy)."""
        return self.load_draft_head().embed(token_ids)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(n, hidden) -> (n, vocab) float32 logits through the target's LM head, on rank 0 alone (the copy)."""
        return self.load_draft_head().compute_logits(hidden)

    def close(self) -> None:
        """Tell the ranks to exit and wait for them a bounded time, when the group is whole; kill what
        remains by pid (at once after a failure, or one at start), and leave the group. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._ready and not self._failed:
            try:
                with self._lock:
                    self._send(bare_message(StepKind.STOP))
                deadline = time.monotonic() + _EXIT_WAIT_S
                for process in self.ranks.values():
                    process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                logger.warning("a rank did not stop within %g s; killing it", _EXIT_WAIT_S)
            except Exception as e:  # noqa: BLE001 - a rank already gone: the rest are killed below
                logger.warning("could not tell the ranks to stop (%s); killing them", e)
        self.kill_ranks()
        leave_groups()

    def kill_ranks(self) -> None:
        """SIGKILL every rank still running, by pid, and reap it (at exit, whatever the way out)."""
        for process in self.ranks.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    def _send(self, message: StepMessage) -> None:
        """Broadcast a header and its payload (the caller holds the lock)."""
        dist.broadcast(message.header, 0, group=self.groups.control)
        if message.payload is not None:
            dist.broadcast(message.payload, 0, group=self.groups.data)
        self._last_sent = time.monotonic()

    def _join(self) -> RankGroups:
        """Join the group as rank 0, watching the ranks meanwhile: one that exits first (a bad install, a
        crash at import) is reported at once rather than after the rendezvous's timeout."""
        joined: list[RankGroups] = []
        errors: list[BaseException] = []

        def join() -> None:
            try:
                spec = self.spec
                joined.append(
                    join_groups(spec.init_address, 0, spec.world_size, spec.device, spec.rank_timeout)
                )
            except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
                errors.append(e)

        thread = threading.Thread(target=join, name="rank-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.5)
            dead = self._dead_rank()
            if dead is not None and thread.is_alive():
                raise RankGroupFailure(f"{dead} before it joined the engine's group; its log above says why")
        if errors:
            raise RankGroupFailure(f"the engine's rank group did not form: {errors[0]}") from errors[0]
        return joined[0]

    def _guarded(self, call: Callable[[], T], when: str) -> T:
        """``call()``; any exception ends the group: RankGroupFailure naming the rank that died, if one did."""
        try:
            return call()
        except Exception as e:
            self._failed = True
            dead = self._dead_rank(_DEATH_WAIT_S)
            first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
            if dead is not None:
                raise RankGroupFailure(f"{dead} {when}; the engine ends with it ({first_line})") from e
            raise RankGroupFailure(
                f"a rank failed or kept the others waiting past --rank-timeout {self.spec.rank_timeout:g} s "
                f"{when}; the engine ends ({type(e).__name__}: {first_line})"
            ) from e

    def _dead_rank(self, wait_s: float = 0.0) -> str | None:
        """'rank 1 of 2 (pid 123) was killed by SIGKILL' for the first rank that has exited (each given up to
        ``wait_s`` seconds to be seen exiting), or None."""
        for rank, process in self.ranks.items():
            try:
                code = process.wait(wait_s) if wait_s else process.poll()
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                how = (
                    f"was killed by {signal.Signals(-code).name}"
                    if code < 0
                    else f"exited with status {code}"
                )
                return f"rank {rank} of {self.spec.world_size} (pid {process.pid}) {how}"
        return None

    def _watch(self) -> None:
        """While the engine runs: end it when a rank dies between steps (a step's own failure raises in the
        step), and ping the ranks when idle so that their wait for the next header stays bounded."""
        while not self._closed.wait(1.0):
            dead = self._dead_rank()
            if dead is not None and not self._closed.is_set() and not self._failed:
                self._failed = True
                logger.error("%s; the engine ends with it", dead)
                self.kill_ranks()
                os._exit(1)  # the main thread may be inside a collective that cannot return
            if time.monotonic() - self._last_sent >= PING_S and self._lock.acquire(blocking=False):
                try:
                    if not self._closed.is_set():
                        self._send(bare_message(StepKind.PING))
                except Exception as e:  # noqa: BLE001 - the dead rank is found on the next turn
                    logger.warning("could not ping the ranks: %s", e)
                finally:
                    self._lock.release()
