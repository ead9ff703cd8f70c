"""A tensor-parallel rank process (``python -m openinfer.engine_core.worker.parallel.rank_worker SPEC_JSON``), started
by its engine's :class:`~openinfer.engine_core.worker.parallel.rank_group.ParallelRunner`, never by hand.

It joins the engine's group, builds its shard's ``ModelRunner`` and then runs every step the driver
broadcasts, in order, until a STOP header (exit 0). Anything that fails (its own error, or a collective whose
peer is gone: the driver died) exits 1 after a log line; it also dies with the driver's process (prctl), so
it never outlives its engine.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from openinfer.engine_core.models.tensor_parallel import TensorParallel
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.parallel.rank_spec import RankGroups, RankSpec, join_groups, leave_groups
from openinfer.engine_core.worker.parallel.step_broadcast import (
    HEADER_LEN,
    StepKind,
    header_kind,
    payload_size,
    unpack_step,
)
from openinfer.kernels.backend_name import BackendName

logger = logging.getLogger("openinfer.engine")


def serve_steps(runner: ModelRunner, groups: RankGroups) -> None:
    """Run the driver's steps until it says STOP: each a header on the control group, then its payload."""
    header = torch.empty(HEADER_LEN, dtype=torch.int64)
    while True:
        dist.broadcast(header, 0, group=groups.control)  # waits as long as the engine is idle (pings)
        kind = header_kind(header)
        if kind is StepKind.STOP:
            return
        if kind is StepKind.PING:
            continue
        payload = torch.empty(payload_size(header), dtype=torch.int64)
        dist.broadcast(payload, 0, group=groups.data)
        step, aux_layer_ids = unpack_step(header, payload)
        runner.execute(step, aux_layer_ids)  # rank 0 keeps the output; this rank's part is the collectives


def run_rank(spec: RankSpec) -> None:
    """Join, load this rank's shard, say ready (a barrier with the driver), serve steps."""
    groups = join_groups(spec.init_address, spec.rank, spec.world_size, spec.device, spec.rank_timeout)
    runner = ModelRunner(
        Path(spec.model_path), torch.device(spec.device), spec.num_kv_blocks, spec.block_size,
        spec.torch_dtype, BackendName(spec.attention_backend), spec.enforce_eager, spec.max_num_seqs,
        spec.state_geometry,
        parallel=TensorParallel(spec.rank, spec.world_size, groups.model, spec.enable_expert_parallel),
    )  # fmt: skip
    dist.barrier(group=groups.control)
    serve_steps(runner, groups)


def main(argv: list[str] | None = None) -> None:
    """Entry point of a rank process: its :class:`RankSpec` as JSON, the one argument."""
    parser = argparse.ArgumentParser(prog="openinfer-rank", description=__doc__)
    parser.add_argument("spec", help="the rank's RankSpec as JSON (its engine writes it)")
    spec = RankSpec.decode(parser.parse_args(argv).spec)
    logging.basicConfig(
        level=spec.log_level.upper(),
        format=f"%(asctime)s engine{spec.engine_index} rank{spec.rank} %(levelname)s %(message)s",
    )
    if os.getppid() != spec.parent_pid:  # the engine died before this rank could watch it
        logger.error("rank %d: its engine (pid %d) is gone; exiting", spec.rank, spec.parent_pid)
        sys.exit(1)
    torch.set_num_threads(spec.num_threads)
    code = 0
    try:
        run_rank(spec)
    except ValueError as e:  # what the model cannot do at this size: the driver says it too, and exits 2
        logger.error("rank %d: %s", spec.rank, e)
        code = 1
    except Exception:
        gone = os.getppid() != spec.parent_pid
        why = f"its engine (pid {spec.parent_pid}) is gone" if gone else "it failed"
        logger.exception("rank %d of %d stops: %s", spec.rank, spec.world_size, why)
        code = 1
    finally:
        leave_groups()
    sys.exit(code)


if __name__ == "__main__":
    main()
