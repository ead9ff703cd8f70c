"""The engine's kernel table: which implementation runs each kind of kernel, chosen once per engine from the
device, ``--attention-backend`` and the packages installed (`choose_kernel_backends`), named in one line at start
(`KernelBackends.describe`) and handed to the model's layers, which never look at a tensor's device to choose.

| kernel      | CPU     | CUDA                                                                          |
| ----------- | ------- | ----------------------------------------------------------------------------- |
| attention   | torch   | triton (auto), torch, or flash_attn (needs flash-attn and a block size % 256) |
| gated delta | torch   | triton for short steps; fla for long ones where `fla` is installed, else torch |
| causal conv | torch   | triton for short steps, torch for long ones                                   |
| MoE experts | torch   | triton                                                                        |
| sampling    | torch   | torch                                                                         |

No choice turns on the dtype: every kernel here takes float32, bfloat16 and float16 (flash-attn only the
16-bit ones). The Triton and flash-attn modules are imported only when chosen, so the CPU
path never imports triton (tests run Triton attention on the CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch
from torch import Tensor

from openinfer.kernels.attention import TorchAttentionBackend
from openinfer.kernels.attention_backend import AttentionBackend
from openinfer.kernels.backend_name import BackendName
from openinfer.kernels.gated_delta import causal_conv1d, gated_delta_rule
from openinfer.kernels.moe import grouped_experts
from openinfer.kernels.state_index import RECURRENT_MAX_QUERY_LEN, StateIndex

# flash-linear-attention (the `gdn` extra) runs long Gated DeltaNet steps on CUDA where installed; never in the
# CPU test venv, where transformers would swap its Qwen3.5 reference functions for fla's.
FLA_AVAILABLE = importlib.util.find_spec("fla") is not None


class CausalConvFn(Protocol):
    """`gated_delta.causal_conv1d`'s signature: x (N, C), weight (C, W), conv_state (S, C, W-1) -> (N, C)."""

    def __call__(self, x: Tensor, weight: Tensor, conv_state: Tensor, index: StateIndex) -> Tensor: ...


class GatedDeltaFn(Protocol):
    """`gated_delta.gated_delta_rule`'s signature (without its benchmarks' threshold keyword)."""

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, index: StateIndex
    ) -> Tensor: ...


class ExpertsFn(Protocol):
    """`moe.grouped_experts`' signature: hidden (T, H), w13 (E, 2I, H), w2 (E, H, I), weights and ids (T, k)."""

    def __call__(
        self, hidden: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor
    ) -> Tensor: ...


KernelFn = TypeVar("KernelFn", CausalConvFn, GatedDeltaFn)


@dataclass(frozen=True)
class StepForms(Generic[KernelFn]):
    """A Gated DeltaNet kernel over state slots as the two functions of the backend chosen for it: `short` for
    steps whose longest request has at most RECURRENT_MAX_QUERY_LEN tokens (decode, verification: the form CUDA
    graphs capture), `long` for the others (prefill chunks). Which functions is decided once; which of the two
    a step takes is its shape, decided per call (`for_step`)."""

    name: str  # "torch", or the short form's backend then the long form's ("triton+fla")
    short: KernelFn
    long: KernelFn

    def for_step(self, index: StateIndex) -> KernelFn:
        return self.short if index.max_query_len <= RECURRENT_MAX_QUERY_LEN else self.long


@dataclass(frozen=True)
class ExpertsBackend:
    """The MoE experts' kernel (the sum kernels/moe.py's docstring states) and its name."""

    name: str  # "torch" (grouped matmuls) or "triton" (the fused-MoE kernel)
    run: ExpertsFn
    # whether a pair whose id is E (an expert another rank holds) costs nothing; else ids must be < E
    skips_absent: bool = False


@dataclass(frozen=True)
class KernelBackends:
    """Every kernel choice of one engine, made once (`choose_kernel_backends`) and passed to the layers."""

    attention: AttentionBackend
    gated_delta: StepForms[GatedDeltaFn]
    causal_conv: StepForms[CausalConvFn]
    moe: ExpertsBackend
    # the sampler's kernels: torch ops on the logits' device everywhere (kernels/sampling.py, verification.py);
    # one implementation today, named so the start line says it
    sampling: str

    def describe(self) -> str:
        """The one line an engine logs at start, e.g. "attention triton (CUDA graphs), gated delta triton+fla,
        causal conv triton+torch, MoE triton, sampling torch"."""
        graphs = " (CUDA graphs)" if self.attention.cuda_graphs else ""
        return (
            f"attention {self.attention.name}{graphs}, gated delta {self.gated_delta.name}, causal conv "
            f"{self.causal_conv.name}, MoE {self.moe.name}, sampling {self.sampling}"
        )


def choose_kernel_backends(
    device: torch.device,
    attention: BackendName = BackendName.AUTO,
    block_size: int = 16,
    *,
    fla_installed: bool = FLA_AVAILABLE,
) -> KernelBackends:
    """The kernel table's row for `device`, ``--attention-backend`` `attention`, caches of `block_size` and
    whether flash-linear-attention is installed. Raises ValueError (or ImportError) for an attention backend
    the device or the installed packages cannot run, with what to use instead."""
    attention_backend = select_backend(device, attention, block_size)
    if device.type == "cuda":
        gated_delta, causal_conv, moe = _cuda_kernels(fla_installed)
    else:
        gated_delta = StepForms("torch", gated_delta_rule, gated_delta_rule)
        causal_conv = StepForms("torch", causal_conv1d, causal_conv1d)
        moe = ExpertsBackend("torch", grouped_experts, skips_absent=True)
    return KernelBackends(attention_backend, gated_delta, causal_conv, moe, sampling="torch")


def _cuda_kernels(
    fla_installed: bool,
) -> tuple[StepForms[GatedDeltaFn], StepForms[CausalConvFn], ExpertsBackend]:
    """CUDA's Gated DeltaNet and MoE kernels: Triton for short steps and the experts, fla or torch for long
    steps (imported here, so that only CUDA imports Triton)."""
    from openinfer.kernels.triton_causal_conv1d import causal_conv1d_triton
    from openinfer.kernels.triton_gated_delta import gated_delta_rule_triton
    from openinfer.kernels.triton_moe import fused_experts_triton

    gated_delta: StepForms[GatedDeltaFn] = StepForms(
        "triton+torch", gated_delta_rule_triton, gated_delta_rule
    )
    if fla_installed:
        from openinfer.kernels.fla_gated_delta import gated_delta_rule_fla

        gated_delta = StepForms("triton+fla", gated_delta_rule_triton, gated_delta_rule_fla)
    conv: StepForms[CausalConvFn] = StepForms("triton+torch", causal_conv1d_triton, causal_conv1d)
    return gated_delta, conv, ExpertsBackend("triton", fused_experts_triton)


def select_backend(
    device: torch.device, name: BackendName = BackendName.AUTO, block_size: int = 16
) -> AttentionBackend:
    """The attention column of the table: backend `name` (``--attention-backend``) for `device` and caches of
    `block_size`.

    auto: the Triton kernels on CUDA, the torch backend on the CPU; torch; triton; flash_attn. triton and
    flash_attn need CUDA (triton also runs on the CPU under TRITON_INTERPRET=1, for tests).
    """
    if name not in set(BackendName):
        raise ValueError(f"--attention-backend must be auto, torch, triton or flash_attn, got {name!r}")
    name = BackendName(name)
    if name is BackendName.AUTO:
        name = BackendName.TRITON if device.type == "cuda" else BackendName.TORCH
    if name is BackendName.TORCH:
        return TorchAttentionBackend(reads_in_place=device.type == "cpu")
    interpreted = name is BackendName.TRITON and os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda" and not interpreted:
        raise ValueError(f"--attention-backend {name} needs a CUDA device; on {device} use torch (or auto)")
    if name is BackendName.TRITON:
        from openinfer.kernels.triton_attention import TritonAttentionBackend

        return TritonAttentionBackend()
    from openinfer.kernels.flash_attention import FlashAttentionBackend

    return FlashAttentionBackend(block_size)
