"""benchmarks/moe_kernel.py times only on CUDA; elsewhere it says so and succeeds."""

from __future__ import annotations

import pytest
import torch

from openinfer.benchmarks.moe_kernel import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_says_so_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    """Without CUDA: exit status 0 and one line saying CUDA is needed, nothing timed."""
    assert main([]) == 0
    assert capsys.readouterr().out.startswith("moe_kernel.py needs CUDA")
