"""``openinfer-engine``'s flags and the :class:`EngineConfig` they make, without torch: the one flag table of
``openinfer-engine`` and ``openinfer-serve`` (which adds the same flags and passes them on to each engine).

:func:`add_engine_args` holds every flag about what an engine serves and how (vLLM's names); the flags that
place one engine (its device, index, frontend, keys, log level) are :func:`parse_args`' own, since a launcher
sets those per engine. :func:`config_from_args` checks the rules between the flags and builds the config (the
rules of one value are the config's own ``__post_init__``); ``openinfer-serve`` runs it on its first engine's
command line before it starts anything, and fills in its engines' drafter flags with :func:`drafter_flags`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from openinfer.engine_core.builtin_model import (
    BUILTIN_DRAFTERS,
    BUILTIN_MODEL_NAME,
    builtin_drafter_folder,
    builtin_target_folder,
    builtin_tokenizer_folder,
    is_builtin_target,
)
from openinfer.engine_core.compilation_config import with_level
from openinfer.engine_core.config import (
    DEFAULT_CPU_KV_CACHE_GB,
    Device,
    DeviceKind,
    DrafterSpec,
    EngineConfig,
    ModelDtype,
    from_flags,
)
from openinfer.engine_core.process.vllm_json_flags import add_vllm_json_args
from openinfer.engine_core.spec_decode.drafter_loaders import default_drafter_folders, folder_drafter
from openinfer.kernels.backend_name import BackendName
from openinfer.protocol import DFlashAnchor, DrafterMethod

FAKE_MODEL_NAME = "openinfer-fake"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``openinfer-engine``'s command line: one engine's placement, then :func:`add_engine_args`."""
    parser = argparse.ArgumentParser(
        prog="openinfer-engine",
        description="One engine-core process, connected to a frontend over ZeroMQ.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--gpu",
        type=gpu_list,
        metavar="N[,N...]",
        help="run on CUDA device N; with --tensor-parallel-size N, one device per rank (--gpu 0,1)",
    )
    where.add_argument(
        "--device",
        choices=list(DeviceKind),
        default=DeviceKind.CPU,
        help="run on this device (cuda: device 0; with --tensor-parallel-size N, the first N of "
        "CUDA_VISIBLE_DEVICES; cpu: N CPU ranks)",
    )
    parser.add_argument(
        "--frontend",
        dest="frontend_addresses",
        nargs="+",
        metavar="ADDRESS",
        default=["tcp://127.0.0.1:5555"],
        help="the frontend's engine address tcp://HOST:PORT (outputs go to PORT+1); with several frontends "
        "over the same engines, each one's: the first exports this engine's metrics",
    )
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument(
        "--zmq-curve-keys",
        dest="curve_keys",
        type=Path,
        metavar="DIR",
        help="encrypt and authenticate the frontend connection with CurveZMQ keys made by openinfer-keys DIR",
    )
    parser.add_argument("--log-level", default="info")
    add_engine_args(parser)
    return parser.parse_args(argv)


def gpu_list(text: str) -> tuple[int, ...]:
    """``--gpu``'s value: CUDA device indices, comma-separated (``0`` or ``0,1``)."""
    try:
        gpus = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--gpu takes device indices such as 0 or 0,1, got {text!r}"
        ) from None
    if min(gpus) < 0 or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"--gpu takes distinct device indices >= 0, got {text!r}")
    return gpus


# vLLM's other names for --dtype's values.
DTYPE_ALIASES = {"half": "float16", "float": "float32"}


def add_engine_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Every flag about what an engine serves and how (not where it runs: see :func:`parse_args`)."""
    parser.add_argument("--model", help="Hugging Face Qwen3 folder (default: the built-in tiny model)")
    parser.add_argument("--served-model-name", help="the model name clients use (default: --model as given)")
    parser.add_argument(
        "--dtype",
        default="auto",
        type=lambda name: DTYPE_ALIASES.get(name, name),
        choices=list(ModelDtype),
        help="weights and KV cache (auto: float32 on the CPU, bfloat16 on CUDA; vLLM's half and float too)",
    )
    parser.add_argument(
        "--kv-cache-gb",
        type=float,
        help="KV cache memory in GiB, per rank (default: --gpu-memory-utilization's share on CUDA, "
        f"{DEFAULT_CPU_KV_CACHE_GB:g} on the CPU)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="CUDA: the fraction of each GPU's memory this engine may use; the KV cache gets what the weights "
        "and activations leave of it, unless --kv-cache-gb or --num-kv-blocks (vLLM's flag). No effect on "
        "the CPU",
    )
    parser.add_argument("--num-kv-blocks", type=int, help="exact KV block count (overrides --kv-cache-gb)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument(
        "--attention-backend",
        default="auto",
        choices=list(BackendName),
        help="auto: triton on CUDA, torch on the CPU; flash_attn needs flash-attn and a --block-size multiple of 256",
    )
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-threads",
        type=int,
        help="torch CPU threads, per rank (default 1: best decode latency when engines share the cores; with "
        "--tensor-parallel-size N on the CPU, the cores / N)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=1,
        help="shard the model over N ranks, one process each (Qwen3 dense so far; N must divide the attention "
        "heads): N GPUs (--gpu 0,1,..., or the first N of CUDA_VISIBLE_DEVICES) or N CPU ranks (vLLM's flag)",
    )
    parser.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="with --tensor-parallel-size N: a MoE model's experts split over the ranks, E / N whole experts each "
        "(N must divide them), instead of every expert split by its width (vLLM's flag)",
    )
    parser.add_argument(
        "--rank-timeout",
        type=float,
        default=60.0,
        help="with --tensor-parallel-size > 1: seconds a rank may keep the others waiting inside a step before "
        "the engine ends (a rank that dies ends it at once)",
    )
    parser.add_argument(
        "--spec-method",
        choices=get_args(DrafterMethod),
        help="drafter (default: none; with --draft-model, the folder's: dspark for a DSpark checkpoint, else "
        "dflash)",
    )
    parser.add_argument(
        "--num-spec-tokens",
        type=int,
        help="K, draft tokens per round (at most 32; a --draft-model given without --spec-method: its block's "
        "drafts)",
    )
    parser.add_argument(
        "--draft-model",
        help="DFlash (z-lab's or DeepSpec's layout) or DSpark checkpoint folder (default without --model: the "
        "built-in drafter)",
    )
    parser.add_argument(
        "--confidence-threshold",
        type=float,
        default=0.0,
        help="dspark: verify each round's drafts up to the first whose confidence is below this (DeepSpec's "
        "rule); 0 (the default) verifies them all",
    )
    parser.add_argument(
        "--enable-adaptive-verification",
        action=argparse.BooleanOptionalAction,
        help="each step, verify only the drafts expected to pay for their cost (DSpark's confidences, else the "
        "drafter's measured acceptance; step costs measured at start), and stop proposing while drafting does "
        "not pay (vLLM's name); default: on for dspark, whose confidence head exists to schedule verification, "
        "off for the others",
    )
    parser.add_argument(
        "--dflash-anchor",
        choices=get_args(DFlashAnchor),
        help="which DFlash block slots carry drafts when the checkpoint's config does not say",
    )
    parser.add_argument("--prompt-lookup-min", type=int, default=1, help="ngram: shortest n-gram to match")
    parser.add_argument("--prompt-lookup-max", type=int, default=4, help="ngram: longest n-gram to match")
    parser.add_argument("--spec-log", type=Path, help="append one JSON line per draft to this file")
    parser.add_argument(
        "--allowed-drafter-dir",
        action="append",
        type=Path,
        metavar="DIR",
        help="drafters loaded at run time (the admin API) must lie under DIR, after symlinks and '..' are "
        "resolved; repeatable (default: the folders that hold --model and --draft-model)",
    )
    parser.add_argument(
        "--fake-model",
        action="store_true",
        help="no model: cheap deterministic tokens (a 32-token cycle) with the built-in tokenizer, for "
        "measuring the frontend; works with --spec-method ngram",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run every step eagerly: no compiled model step, no CUDA graphs for decode and verify steps "
        "(vLLM's flag)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV of cached prompt prefixes (on by default; vLLM's flag)",
    )
    add_vllm_json_args(parser)
    parser.add_argument(
        "--step-sleep", type=float, default=0.0, help="seconds slept after each busy step (a slowed engine)"
    )


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine's config from its flags; ValueError, naming the flag, for what cannot work."""
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
    # The built-in target, named or not (openinfer-serve names it), comes with its drafters: --spec-method
    # dflash or dspark, and a run-time load of either, need no folder there.
    builtin = not args.fake_model and is_builtin_target(model_path)
    default_drafts = {m: builtin_drafter_folder(m) for m in BUILTIN_DRAFTERS} if builtin else {}
    method, k, draft_model = drafter_flags(args.spec_method, args.num_spec_tokens, args.draft_model, builtin)
    speculative = None
    if method is not None:
        if k is None:
            raise ValueError("--spec-method needs --num-spec-tokens K")
        speculative = DrafterSpec(
            method,
            k,
            draft_model,
            args.prompt_lookup_min,
            args.prompt_lookup_max,
            args.dflash_anchor,
            args.confidence_threshold,
            adaptive_verification(args.enable_adaptive_verification, method),
        )
    elif (refusal := num_spec_tokens_without_drafter(args)) is not None:
        raise ValueError(refusal)
    elif args.confidence_threshold:
        raise ValueError("--confidence-threshold needs a DSpark drafter (--spec-method dspark)")
    elif args.enable_adaptive_verification:
        raise ValueError("--enable-adaptive-verification needs a drafter (--spec-method or --draft-model)")
    devices = rank_devices(args)
    device = devices[0] if devices else Device(DeviceKind(args.device))
    allowed = args.allowed_drafter_dir or default_drafter_folders(model_path, draft_model)
    return from_flags(
        EngineConfig,
        args,
        model_path=model_path,
        served_model_name=name,
        device=device,
        speculative=speculative,
        default_draft_models=default_drafts,
        allowed_drafter_dirs=tuple(allowed),
        rank_devices=devices,
        compilation=with_level(args.compilation_config, args.optimization_level),
    )


def rank_devices(args: argparse.Namespace) -> tuple[Device, ...]:
    """The devices ``--gpu`` names, one per rank; () without ``--gpu`` (the config fills them in: the CPU,
    or the first N CUDA devices). ValueError when their count is not ``--tensor-parallel-size``."""
    if args.gpu is None:
        return ()
    size = args.tensor_parallel_size
    if size >= 1 and len(args.gpu) != size:  # (a size below 1 is the config's to refuse)
        raise ValueError(
            f"--gpu names {len(args.gpu)} device(s) for --tensor-parallel-size {size}: give one per rank "
            f"(--gpu {','.join(map(str, range(size)))}), or --device cuda for the first {size} of "
            "CUDA_VISIBLE_DEVICES"
        )
    return tuple(Device(DeviceKind.CUDA, gpu) for gpu in args.gpu)


def num_threads(args: argparse.Namespace, cores: int) -> int:
    """torch CPU threads for each of the engine's ranks: ``--num-threads``, else 1, or with N CPU ranks the
    ``cores`` this process may use shared out (at least one each)."""
    if args.num_threads is not None:
        return max(1, args.num_threads)
    size = args.tensor_parallel_size
    return max(1, cores // size) if size > 1 and args.gpu is None and args.device == DeviceKind.CPU else 1


def drafter_flags(
    method: DrafterMethod | None, k: int | None, draft_model: str | None, builtin: bool
) -> tuple[DrafterMethod | None, int | None, Path | None]:
    """``--spec-method``, ``--num-spec-tokens`` and ``--draft-model`` with what they leave out filled in: the
    built-in target's (``builtin``) own folder for its dflash or dspark drafter; for a ``--draft-model`` folder
    given without ``--spec-method``, the method and (without ``--num-spec-tokens``) the K its config says
    (ValueError when it has none readable). ``openinfer-serve`` fills in its engines' flags with it too."""
    folder = Path(draft_model) if draft_model else None
    if folder is None and builtin and method in BUILTIN_DRAFTERS:
        folder = builtin_drafter_folder(method)
    if draft_model is not None and method is None:
        # The folder says which drafter it is and how many drafts its block yields.
        method, folder_k = folder_drafter(Path(draft_model))
        k = folder_k if k is None else k
    return method, k, folder


def adaptive_verification(flag: bool | None, method: DrafterMethod) -> bool:
    """``--[no-]enable-adaptive-verification``, or where it is not given, on for DSpark (its confidence head
    exists to set how many drafts are verified; on the built-in pair it measured faster with it at every
    output length and load, docs/benchmarks.md) and off for the other drafters (not measured so)."""
    return flag if flag is not None else method == "dspark"


def num_spec_tokens_without_drafter(args: argparse.Namespace) -> str | None:
    """The error for ``--num-spec-tokens`` given with neither ``--spec-method`` nor ``--draft-model`` (no drafter
    to draft K tokens), or None. ``openinfer-serve`` refuses it with this too, as a usage error, where it has no
    built-in drafter to fill in."""
    if args.num_spec_tokens is not None and args.spec_method is None and not args.draft_model:
        return "--num-spec-tokens needs --spec-method ngram|dflash|dspark or --draft-model"
    return None
