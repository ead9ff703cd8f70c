"""``openinfer-engine``: one engine-core process, connected to a frontend over ZeroMQ.

The CLI: arguments to an :class:`EngineConfig`, the model runner (the real one, or ``--fake-model``'s), the
CurveZMQ keys; then :class:`EngineProcess` runs the loop.
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
from pathlib import Path
from typing import get_args

import torch
import zmq.auth

from openinfer.engine_core.builtin_model import (
    BUILTIN_MODEL_NAME,
    builtin_drafter_folder,
    builtin_target_folder,
    builtin_tokenizer_folder,
)
from openinfer.engine_core.config import ATTENTION_BACKENDS, DrafterSpec, EngineConfig, from_flags
from openinfer.engine_core.engine_core import EngineCore
from openinfer.engine_core.engine_process import CurveClientKeys, EngineProcess
from openinfer.engine_core.executor import ModelExecutor, resolve_dtype
from openinfer.engine_core.model_runner import ModelRunner
from openinfer.engine_core.models.config import ModelConfig
from openinfer.protocol import DFlashAnchor, DrafterMethod

logger = logging.getLogger("openinfer.engine")

FAKE_MODEL_NAME = "openinfer-fake"


def curve_client_keys(folder: Path, engine_index: int) -> CurveClientKeys:
    """(engine public key, engine secret key, frontend public key) from an ``openinfer-keys`` folder.

    The layout (see :mod:`openinfer.tools.curve_keys`): ``DIR/frontend.key`` and
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="openinfer-engine", description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gpu", type=int, metavar="N", help="run on CUDA device N")
    where.add_argument("--device", choices=["cpu", "cuda"], help="run on this device (cuda: device 0)")
    parser.add_argument("--model", help="Hugging Face Qwen3 folder (default: the built-in tiny model)")
    parser.add_argument("--served-model-name", help="the model name clients use (default: --model as given)")
    parser.add_argument(
        "--frontend",
        dest="frontend_address",
        default="tcp://127.0.0.1:5555",
        help="the frontend's engine address tcp://HOST:PORT (outputs go to PORT+1)",
    )
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: float32 on the CPU, bfloat16 on CUDA",
    )
    parser.add_argument("--kv-cache-gb", type=float, default=1.0, help="KV cache memory in GiB")
    parser.add_argument("--num-kv-blocks", type=int, help="exact KV block count (overrides --kv-cache-gb)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument(
        "--attention-backend",
        default="auto",
        choices=ATTENTION_BACKENDS,
        help="auto: triton on CUDA, torch on the CPU; flash_attn needs flash-attn and a --block-size multiple of 256",
    )
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-threads",
        type=int,
        default=1,
        help="torch CPU threads (1: best decode latency when engines share the cores)",
    )
    spec = parser.add_argument_group("speculative decoding")
    spec.add_argument("--spec-method", choices=get_args(DrafterMethod), help="drafter (default: none)")
    spec.add_argument("--num-spec-tokens", type=int, help="K, draft tokens per round (at most 32)")
    spec.add_argument(
        "--draft-model",
        help="DFlash checkpoint folder (z-lab layout; default without --model: the built-in drafter)",
    )
    spec.add_argument(
        "--dflash-anchor",
        choices=get_args(DFlashAnchor),
        help="which DFlash block slots carry drafts when the checkpoint's config does not say",
    )
    spec.add_argument("--prompt-lookup-min", type=int, default=1, help="ngram: shortest n-gram to match")
    spec.add_argument("--prompt-lookup-max", type=int, default=4, help="ngram: longest n-gram to match")
    spec.add_argument("--spec-log", type=Path, help="append one JSON line per draft to this file")
    parser.add_argument(
        "--fake-model",
        action="store_true",
        help="no model: cheap deterministic tokens (a 32-token cycle) with the built-in tokenizer, for "
        "measuring the frontend; works with --spec-method ngram",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run every step eagerly: no CUDA graphs for decode and verify steps (vLLM's flag)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV of cached prompt prefixes (on by default; vLLM's flag)",
    )
    parser.add_argument(
        "--step-sleep", type=float, default=0.0, help="seconds slept after each busy step (a slowed engine)"
    )
    parser.add_argument(
        "--zmq-curve-keys",
        dest="curve_keys",
        type=Path,
        metavar="DIR",
        help="encrypt and authenticate the frontend connection with CurveZMQ keys made by openinfer-keys DIR",
    )
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    if args.fake_model:
        if args.model is not None:
            raise ValueError("--fake-model serves no model: drop --model")
        model_path = builtin_tokenizer_folder()
        name = args.served_model_name or FAKE_MODEL_NAME
    elif args.model is None:
        model_path = builtin_target_folder()
        name = args.served_model_name or BUILTIN_MODEL_NAME
    else:
        model_path = Path(args.model)
        name = args.served_model_name or args.model
    # The built-in target comes with its DFlash drafter: --spec-method dflash needs no --draft-model there.
    default_draft = builtin_drafter_folder() if args.model is None and not args.fake_model else None
    speculative = None
    if args.spec_method is not None:
        if args.num_spec_tokens is None:
            raise ValueError("--spec-method needs --num-spec-tokens K")
        speculative = DrafterSpec(
            args.spec_method,
            args.num_spec_tokens,
            Path(args.draft_model) if args.draft_model else default_draft,
            args.prompt_lookup_min,
            args.prompt_lookup_max,
            args.dflash_anchor,
        )
    elif args.num_spec_tokens is not None or args.draft_model is not None:
        raise ValueError("--num-spec-tokens and --draft-model need --spec-method ngram|dflash")
    if args.gpu is not None:
        device = f"cuda:{args.gpu}"
    else:
        device = "cuda:0" if args.device == "cuda" else "cpu"
    return from_flags(
        EngineConfig,
        args,
        model_path=model_path,
        served_model_name=name,
        device=device,
        speculative=speculative,
        default_draft_model=default_draft,
    )


def load_runner(config: EngineConfig) -> ModelExecutor:
    """The runner the engine core steps: the Qwen3 folder's, or the fake model's under ``--fake-model``.

    The KV cache holds ``--num-kv-blocks`` blocks, or as many as ``--kv-cache-gb`` buys for this model.
    """
    device = torch.device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if config.fake_model:  # the test double behind a user flag: imported only when asked for
        from openinfer.engine_core.testing.fake_model_runner import FAKE_MODEL_CONFIG, FakeModelRunner

        model_config = FAKE_MODEL_CONFIG
    else:
        model_config = ModelConfig.from_folder(config.model_path)
    num_blocks = config.num_kv_blocks or int(
        config.kv_cache_gb * 2**30 // ModelRunner.kv_block_bytes(model_config, config.block_size, dtype)
    )
    if config.fake_model:
        return FakeModelRunner(config.model_path, device, num_blocks, config.block_size, dtype)
    return ModelRunner(
        config.model_path,
        device,
        num_blocks,
        config.block_size,
        dtype,
        config.attention_backend,
        config.enforce_eager,
        config.max_num_seqs,
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``openinfer-engine``."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s engine{args.engine_index} %(levelname)s %(message)s",
    )
    torch.set_num_threads(max(1, args.num_threads))
    try:
        config = config_from_args(args)
        keys = curve_client_keys(config.curve_keys, config.engine_index) if config.curve_keys else None
        core = EngineCore(config, load_runner(config), incarnation=random.getrandbits(64))
        core.grammars.compilers.warm()
        process = EngineProcess(config, core, keys)
    except (ValueError, FileNotFoundError, ImportError) as e:
        logger.error("%s", e)
        sys.exit(2)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: process.stop())
    logger.info(
        "engine %d (incarnation %016x) serving %s on %s, %d KV blocks of %d; frontend %s",
        config.engine_index,
        process.incarnation,
        config.served_model_name,
        config.device,
        core.facts.num_kv_blocks,
        config.block_size,
        config.frontend_address,
    )
    process.run()
    if process.refusal is not None:
        sys.exit(3)  # the frontend refused it (logged): a status of its own, for supervisors
    logger.info("engine %d stopped", config.engine_index)


if __name__ == "__main__":
    main()
