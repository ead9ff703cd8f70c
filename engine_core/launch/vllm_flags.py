"""``vllm serve`` flags that openinfer does not have: ``openinfer-serve`` takes them so that a vLLM command line
gets a clear answer, accepts their neutral values and refuses the rest, saying what openinfer does instead."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

import msgspec

from openinfer.protocol import DrafterMethod

SCALE_OUT = (
    "to use several GPUs, shard the model over them (--tensor-parallel-size N) or run one engine per GPU "
    "(--engines N --device cuda)"
)


@dataclass(frozen=True)
class UnsupportedFlag:
    """One vLLM flag: values in ``neutral`` are accepted (they ask for nothing openinfer lacks)."""

    names: tuple[str, ...]  # option strings, the long one first
    neutral: tuple[Any, ...]  # accepted values; the first is the default
    refusal: str  # what openinfer does instead, for the error
    type: Callable[[str], Any] | None = str  # None: a switch (store_true)
    nargs: str | None = None

    @property
    def dest(self) -> str:
        return "vllm_" + self.names[0].lstrip("-").replace("-", "_")


UNSUPPORTED: tuple[UnsupportedFlag, ...] = (
    UnsupportedFlag(
        ("--pipeline-parallel-size", "-pp"), (1,), f"openinfer has no pipeline parallelism; {SCALE_OUT}", int
    ),
    UnsupportedFlag(
        ("--data-parallel-size", "-dp"), (1,),
        "openinfer-serve's data parallelism is --engines N (with --device cuda, engine i on GPU i)", int,
    ),
    UnsupportedFlag(
        ("--quantization", "-q"), (None, "none"),
        "openinfer serves unquantized weights only: --dtype auto|float32|bfloat16|float16",
    ),
    UnsupportedFlag(
        ("--kv-cache-dtype",), ("auto",), "openinfer's KV cache has the weights' dtype (--dtype)"
    ),
    UnsupportedFlag(("--enable-lora",), (False,), "openinfer serves no LoRA adapters", None),
    UnsupportedFlag(("--lora-modules",), (None,), "openinfer serves no LoRA adapters", str, "+"),
    UnsupportedFlag(("--cpu-offload-gb",), (0.0,), "openinfer keeps every weight on the engine's device", float),
    UnsupportedFlag(
        ("--tokenizer",), (None,), "openinfer reads the tokenizer from the model folder (tokenizer.json)"
    ),
)  # fmt: skip


def add_unsupported_vllm_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The flags above, plus ``--trust-remote-code``, accepted and ignored: openinfer runs no code from a
    checkpoint."""
    for flag in UNSUPPORTED:
        if flag.type is None:
            parser.add_argument(*flag.names, dest=flag.dest, action="store_true", help=argparse.SUPPRESS)
        else:
            parser.add_argument(
                *flag.names,
                dest=flag.dest,
                type=flag.type,
                nargs=flag.nargs,
                default=flag.neutral[0],
                help=argparse.SUPPRESS,
            )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="vLLM's flag, accepted and ignored: openinfer runs no code from checkpoints",
    )


def unsupported_vllm_flag(args: argparse.Namespace) -> str | None:
    """The error for the first vLLM flag given a value openinfer cannot honour; None when there is none."""
    for flag in UNSUPPORTED:
        value = vars(args)[flag.dest]
        if value not in flag.neutral:
            shown = flag.names[0] if flag.type is None else f"{flag.names[0]} {_shown(value)}"
            return f"{shown} is vLLM's; {flag.refusal}"
    return None


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def unsupported_flags_epilog() -> str:
    """A line for --help naming the vLLM flags that are refused."""
    names = ", ".join(flag.names[0] for flag in UNSUPPORTED)
    return (
        f"vLLM flags openinfer does not have are refused, saying what to use instead: {names} (their neutral "
        "values, such as 1 or none, are accepted)"
    )


SPECULATIVE_CONFIG_HELP = (
    "vLLM's speculative config as JSON: method ngram|dflash|dspark, model (the drafter's folder), "
    "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, enable_adaptive_verification; the same as "
    "--spec-method, --draft-model, --num-spec-tokens and the flags of those names"
)
_SPEC_METHODS: tuple[DrafterMethod, ...] = get_args(DrafterMethod)


class _VllmSpeculativeConfig(msgspec.Struct, forbid_unknown_fields=True):
    """The keys of vLLM's ``--speculative-config`` that openinfer has."""

    method: str
    model: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    enable_adaptive_verification: bool | None = None  # None: the engine's default (on for dspark)


@dataclass(frozen=True)
class SpeculativeConfig:
    """``--speculative-config`` read: the launcher's drafter and the engine flags it adds."""

    method: str
    num_spec_tokens: int | None
    draft_model: str | None
    engine_flags: list[str]


def read_speculative_config(text: str) -> SpeculativeConfig:
    """vLLM's ``--speculative-config`` JSON as openinfer's flags; ValueError naming what openinfer cannot take
    (another method, a key it does not have, a value of the wrong type)."""
    try:
        config = msgspec.json.decode(text, type=_VllmSpeculativeConfig)
    except msgspec.DecodeError as e:
        keys = ", ".join(_VllmSpeculativeConfig.__struct_fields__)
        raise ValueError(f"--speculative-config: {e} (openinfer takes a JSON object of {keys})") from None
    if config.method not in _SPEC_METHODS:
        raise ValueError(
            f"--speculative-config method {config.method!r}: openinfer's are {', '.join(_SPEC_METHODS)}"
        )
    flags = [f"--prompt-lookup-{end}={n}" for end, n in (("min", config.prompt_lookup_min),
             ("max", config.prompt_lookup_max)) if n is not None]  # fmt: skip
    if config.enable_adaptive_verification is not None:
        flags.append(f"--{'' if config.enable_adaptive_verification else 'no-'}enable-adaptive-verification")
    return SpeculativeConfig(config.method, config.num_speculative_tokens, config.model, flags)
