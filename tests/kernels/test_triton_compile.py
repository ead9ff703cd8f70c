"""Every Triton kernel compiles for sm_90 and sm_80 without a GPU, spill-free, within shared memory.

Runs benchmarks/triton_compile.py's CI subset (head_dim 128, the heaviest, at every cache dtype and GQA groups
1 and 8: 48 compiles, about 75 s on 2 CPUs; the full matrix is the benchmark's; then the fused-MoE kernels'
16, about 15 s; then the recurrent gated delta rule's 10, about 5 s; then the causal conv's 12, about 5 s) in a
fresh interpreter, since tests/conftest.py sets TRITON_INTERPRET for this one and the interpreter compiles
nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from triton.backends.nvidia.compiler import get_ptxas

from openinfer.benchmarks.triton_compile import Subset, launches, specialization, specs

KERNELS = [
    "write_kv",
    "paged_attention decode",
    "combine_splits",
    "paged_attention varlen",
    "dflash_block_attention",
    "moe_gate_up",
    "moe_down",
    "gated_delta_save",
    "gated_delta_recurrent",
    "causal_conv1d_save",
    "causal_conv1d",
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
    # 24 attention launches per target (the subset's), 8 MoE ones (2 kernels, bf16/fp16, decode/prefill rows)
    # and 5 gated delta ones (the float32 state copy once; the recurrence at bf16/fp16, decode/verify lengths)
    # and 6 causal conv ones (the state copy at bf16/fp16; the conv at bf16/fp16, decode/verify lengths)
    assert "86 launches compiled, 0 failing the check" in done.stdout


# Real launches of the engine's kernels compiled with bad options, each beside the backend's own: the varlen
# paged attention (head_dim 128, float32, GQA group 8: the widest tile) with one warp instead of eight holds the
# whole tile in one warp's registers and spills on sm_90; the DFlash block attention (bf16) with 6 pipeline
# stages instead of 2 buffers past sm_80's 163 KiB of shared memory per block.
BAD_LAUNCHES = """
import dataclasses
from openinfer.benchmarks.triton_compile import Row, Spec, launches
from openinfer.kernels.triton_launch import compile_launch
for kernel, spec, target, option, bad in (
    ("paged_attention varlen", Spec(128, 8, "fp32", 16, 3), 90, "num_warps", 1),
    ("dflash_block_attention", Spec(128, 8, "bf16", 16, 3), 80, "num_stages", 6),
):
    launch = dict(launches(spec))[kernel]
    for value in (getattr(launch, option), bad):
        compiled = compile_launch(dataclasses.replace(launch, **{option: value}), target)
        print(f"{kernel}|{value}|{Row(kernel, spec, target, compiled, None).problem()}")
"""


@pytest.mark.skipif(ptxas_missing() is not None, reason=ptxas_missing() or "")
def test_spills_and_shared_memory_past_the_limit_fail_the_check() -> None:
    """The check fails what ptxas and Triton report: a spilling launch and one past the shared-memory limit,
    while the same kernels with the backend's options pass."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", BAD_LAUNCHES], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("|") for line in done.stdout.splitlines() if line.count("|") == 2]
    assert [(kernel, problem) for kernel, _, problem in rows[::2]] == [
        ("paged_attention varlen", "None"),
        ("dflash_block_attention", "None"),
    ]  # the backend's own launches
    (_, warps, spilled), (_, stages, shared) = rows[1], rows[3]
    assert warps == "1" and re.fullmatch(r"[1-9]\d* bytes spilled", spilled), spilled
    assert stages == "6" and re.fullmatch(r"[1-9]\d* bytes of shared memory > 166912", shared), shared


def test_every_spec_of_the_full_matrix_builds_its_launches() -> None:
    """The full matrix (the benchmark's default, too slow for the suite to compile) at least builds every
    launch, each request's positions inside its block table: block size 1 with 3-column tables once failed
    here, before anything compiled."""
    keys = {
        (kernel, target, specialization(launch))
        for spec in specs(Subset.FULL)
        for kernel, launch in launches(spec)
        for target in (90, 80)
    }
    assert len(keys) == 392  # distinct compilations of the matrix, as the benchmark dedups them
