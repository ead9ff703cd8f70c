"""``openinfer-engine``: one engine-core process, connected to a frontend over ZeroMQ.

The CLI: arguments to an :class:`EngineConfig`, the model runner (the real one, or ``--fake-model``'s), the
CurveZMQ keys; then :class:`EngineProcess` runs the loop.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
from pathlib import Path

import torch
import zmq.auth

from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.core.kv_sizing import GpuMemory, kv_block_bytes, num_kv_blocks, state_geometry
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.process.engine_args import config_from_args, num_threads, parse_args
from openinfer.engine_core.process.engine_process import CurveClientKeys, EngineProcess
from openinfer.engine_core.process.tokenizer_files import check_tokenizer_files
from openinfer.engine_core.worker.executor import ModelExecutor, resolve_dtype
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.parallel.rank_group import ParallelRunner, RankGroupFailure, init_address
from openinfer.engine_core.worker.parallel.rank_spec import RankSpec

__all__ = ["config_from_args", "main", "parse_args"]  # the flags live in engine_args.py (no torch there)
logger = logging.getLogger("openinfer.engine")


def curve_client_keys(folder: Path, engine_index: int) -> CurveClientKeys:
    """(engine public key, engine secret key, frontend public key) from an ``openinfer-keys`` folder.

    The layout (see :mod:`openinfer.frontend.engines.server_keys`): ``DIR/frontend.key`` and
    ``DIR/engines/engine-<index>.key_secret``.
    """
    frontend_key = folder / "frontend.key"
    engine_key = folder / "engines" / f"engine-{engine_index}.key_secret"
    for path in (frontend_key, engine_key):
        if not path.is_file():
            raise FileNotFoundError(
                f"--zmq-curve-keys: {path} not found; make keys with `openinfer-keys {folder} --engines N` "
                "and copy the frontend's public key and this engine's key pair to its host"
            )
    server_public, _ = zmq.auth.load_certificate(frontend_key)
    public, secret = zmq.auth.load_certificate(engine_key)
    if secret is None:
        raise ValueError(f"--zmq-curve-keys: {engine_key} holds no secret key")
    return CurveClientKeys(public, secret, server_public)


def load_runner(config: EngineConfig, threads: int = 1, log_level: str = "info") -> ModelExecutor:
    """The runner the engine core steps: the Qwen3 folder's, or the fake model's under ``--fake-model``; with
    ``--tensor-parallel-size N`` > 1 a :class:`ParallelRunner` (this process rank 0, N - 1 rank processes of
    ``threads`` torch threads each, logging at ``log_level``).

    The KV cache holds as many blocks as :func:`kv_sizing.num_kv_blocks` says (``--num-kv-blocks``,
    ``--kv-cache-gb``, ``--gpu-memory-utilization``), a block being the target's page and the start-time
    drafter's context-cache page together.
    """
    device = torch.device(str(config.device))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device cuda (or --gpu): this torch ({torch.__version__}) sees no CUDA device; install a CUDA "
            "build of torch on a GPU machine, or run with --device cpu"
        )
    dtype = resolve_dtype(config.dtype, device)
    if config.fake_model:  # the test double behind a user flag: imported only when asked for
        from openinfer.engine_core.worker.fake_model_runner import FAKE_MODEL_CONFIG, FakeModelRunner

        model_config = FAKE_MODEL_CONFIG
    else:
        model_config = ModelConfig.from_folder(config.model_path)
    gpu = GpuMemory(*torch.cuda.mem_get_info(device)) if device.type == "cuda" else None
    # first: it checks the start-time drafter against the target, before anything is sized from it
    block_bytes = kv_block_bytes(config, model_config, dtype)  # a rank's
    states = state_geometry(config, model_config, dtype, gpu)  # a hybrid model's; None for Qwen3
    num_blocks = num_kv_blocks(config, model_config, dtype, block_bytes, gpu, states)
    if config.fake_model:
        return FakeModelRunner(config.model_path, device, num_blocks, config.block_size, dtype)
    if config.tensor_parallel_size > 1:
        if config.compilation.compiles:  # the all-reduces inside a traced graph are not built yet
            logger.warning(
                "the model step runs eagerly under --tensor-parallel-size > 1: -O1..3 not built there"
            )
        spec = RankSpec(
            config.engine_index, 0, config.tensor_parallel_size, init_address(), os.getpid(),
            str(config.model_path), str(device), str(dtype).removeprefix("torch."), num_blocks,
            config.block_size, config.attention_backend, config.enforce_eager, config.max_num_seqs, threads,
            config.rank_timeout, log_level, config.enable_expert_parallel, states,
        )  # fmt: skip
        return ParallelRunner(spec, [str(d) for d in config.rank_devices])
    return ModelRunner(
        config.model_path,
        device,
        num_blocks,
        config.block_size,
        dtype,
        config.attention_backend,
        config.enforce_eager,
        config.max_num_seqs,
        states,
        compilation=config.compilation,
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``openinfer-engine``."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s engine{args.engine_index} %(levelname)s %(message)s",
    )
    threads = num_threads(args, len(os.sched_getaffinity(0)))
    torch.set_num_threads(threads)
    try:
        config = config_from_args(args)
        keys = curve_client_keys(config.curve_keys, config.engine_index) if config.curve_keys else None
        check_tokenizer_files(config.model_path)
        runner = load_runner(config, threads, args.log_level)
        core = EngineCore(config, runner, incarnation=random.getrandbits(64))
        core.grammars.compilers.warm()
        process = EngineProcess(config, core, keys)
    except (ValueError, FileNotFoundError, ImportError) as e:
        logger.error("%s", e)
        sys.exit(2)
    except RankGroupFailure as e:  # a rank died or failed while the engine started
        logger.error("%s", e)
        sys.exit(1)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: process.stop())
    logger.info(
        "engine %d (incarnation %016x) serving %s on %s, %d KV blocks of %d; frontend(s) %s",
        config.engine_index,
        process.incarnation,
        config.served_model_name,
        config.device,
        core.facts.num_kv_blocks,
        config.block_size,
        " ".join(config.frontend_addresses),
    )
    process.run()
    if isinstance(runner, ParallelRunner):
        runner.close()  # the ranks told to stop; killed by pid if they do not
    if process.failure is not None:  # a rank died, failed or hung: the whole engine ends
        logger.error("engine %d ends: %s", config.engine_index, process.failure)
        sys.exit(1)
    if process.refusal is not None:
        sys.exit(3)  # the frontend refused it (logged): a status of its own, for supervisors
    logger.info("engine %d stopped", config.engine_index)


if __name__ == "__main__":
    main()
