"""The kernel table (kernels/kernel_backends.py): one row per device and installed packages, each kernel's choice
named in the engine's start line, the step's shape the only choice left per call, and the CPU row importing no
Triton."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from openinfer.kernels.attention import TorchAttentionBackend
from openinfer.kernels.backend_name import BackendName
from openinfer.kernels.gated_delta import causal_conv1d, gated_delta_rule
from openinfer.kernels.kernel_backends import choose_kernel_backends
from openinfer.kernels.moe import grouped_experts
from openinfer.kernels.state_index import RECURRENT_MAX_QUERY_LEN, StateIndex

CPU = torch.device("cpu")


def test_cpu_row_is_torch_throughout() -> None:
    """On the CPU every kernel is torch's form, short and long steps alike."""
    kernels = choose_kernel_backends(CPU)
    assert (
        kernels.describe()
        == "attention torch, gated delta torch, causal conv torch, MoE torch, sampling torch"
    )
    assert kernels.gated_delta.short is kernels.gated_delta.long is gated_delta_rule
    assert kernels.causal_conv.short is kernels.causal_conv.long is causal_conv1d
    assert kernels.moe.run is grouped_experts


def test_cuda_row_without_fla() -> None:
    """The CUDA row, chosen on a machine without a GPU (nothing runs): Triton kernels for attention, the short
    Gated DeltaNet steps and the experts; torch's chunked form for long steps where fla is not installed."""
    kernels = choose_kernel_backends(torch.device("cuda"), fla_installed=False)
    assert kernels.describe() == (
        "attention triton (CUDA graphs), gated delta triton+torch, causal conv triton+torch, MoE triton, "
        "sampling torch"
    )
    assert kernels.gated_delta.long is gated_delta_rule  # long prefill chunks: torch's chunked form
    assert kernels.causal_conv.long is causal_conv1d


def test_attention_column_follows_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--attention-backend torch`` on CUDA is torch's padded backend; Triton on a CPU without the interpreter
    is refused, naming what to use."""
    kernels = choose_kernel_backends(torch.device("cuda"), BackendName.TORCH, fla_installed=False)
    assert kernels.attention.name == "torch"
    assert isinstance(kernels.attention, TorchAttentionBackend)
    assert not kernels.attention.reads_in_place  # CUDA: the padded gather, no host-side block runs
    cpu_attention = choose_kernel_backends(CPU).attention
    assert isinstance(cpu_attention, TorchAttentionBackend) and cpu_attention.reads_in_place
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs a CUDA device; on cpu use torch"):
        choose_kernel_backends(CPU, BackendName.TRITON)


@pytest.mark.parametrize("longest", [1, RECURRENT_MAX_QUERY_LEN, RECURRENT_MAX_QUERY_LEN + 1])
def test_step_shape_picks_the_form(longest: int) -> None:
    """A step whose longest request has at most RECURRENT_MAX_QUERY_LEN tokens takes the short form (the one
    CUDA graphs capture), a longer one the long form: the one choice made per call."""
    forms = choose_kernel_backends(torch.device("cuda"), fla_installed=False).gated_delta
    index = StateIndex.build([0, 1, 1 + longest], [0, 1], list(range(1 + longest)), CPU)
    expected = forms.short if longest <= RECURRENT_MAX_QUERY_LEN else forms.long
    assert forms.for_step(index) is expected


def test_cpu_row_imports_no_triton() -> None:
    """Choosing the CPU row, in a fresh interpreter, imports neither Triton nor fla."""
    code = (
        "import sys, torch\n"
        "from openinfer.kernels.kernel_backends import choose_kernel_backends\n"
        "choose_kernel_backends(torch.device('cpu'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'fla')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
