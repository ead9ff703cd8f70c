"""Every Triton kernel compiles for sm_90 and sm_80 without a GPU, spill-free, within shared memory.

Runs benchmarks/triton_compile.py's CI subset (head_dim 128, the heaviest, at every cache dtype and GQA groups
1 and 8: 48 compiles, about 75 s on 2 CPUs; the full matrix is the benchmark's) in a fresh interpreter, since
tests/conftest.py sets TRITON_INTERPRET for this one and the interpreter compiles nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from triton.backends.nvidia.compiler import get_ptxas

KERNELS = [
    "write_kv",
    "paged_attention decode",
    "combine_splits",
    "paged_attention varlen",
    "dflash_block_attention",
]


def ptxas_missing() -> str | None:
    try:
        get_ptxas(90)
    except Exception as error:  # noqa: BLE001 - any failure to find it means nothing can be compiled
        return f"Triton's ptxas is unavailable ({error}); reinstall the triton wheel"
    return None


@pytest.mark.skipif(ptxas_missing() is not None, reason=ptxas_missing() or "")
def test_every_kernel_compiles_for_sm90_and_sm80() -> None:
    """The CI subset compiles for both targets with no error, no attention spill, shared memory in bounds."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [
        sys.executable,
        "-m",
        "openinfer.benchmarks.triton_compile",
        "--targets",
        "90",
        "80",
        "--subset",
        "ci",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and " sm_" in line]
    for kernel in KERNELS:
        for target in ("sm_90", "sm_80"):
            assert any(row.startswith(f"| {kernel} |") and f"| {target} |" in row for row in rows), (
                kernel,
                target,
            )
    assert all(row.endswith("| ok |") for row in rows)
    assert "48 launches compiled, 0 failing the check" in done.stdout  # 24 per target (the subset's)
