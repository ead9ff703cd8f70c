"""Our gated delta rule against flash-linear-attention's fused recurrent kernel (fla_check.py, in a process of
its own with fla from .fla/, where .ci/run installs it: never into the venv, where transformers would take it
for its Qwen3.5 reference)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLA_DIR = Path(os.environ.get("OPENINFER_FLA_DIR", ROOT / ".fla"))


@pytest.mark.skipif(
    not (FLA_DIR / "fla").is_dir(),
    reason="flash-linear-attention is not in .fla/: pip install --no-deps --target .fla "
    "flash-linear-attention==0.6.0 fla-core==0.6.0 einops (as .ci/run does)",
)
def test_gated_delta_rule_equals_fla_fused_recurrent() -> None:
    """Varlen batches for both of our forms: outputs and final states within 1e-5 of fla's (float32, fla's
    Triton kernel under the interpreter)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FLA_DIR), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "kernels" / "fla_check.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("final states") == 2, result.stdout


FLA_KERNELS = [
    "fla fused_recurrent_gated_delta_rule_fwd",
    "fla l2norm_fwd",
    "fla chunk_local_cumsum",
    "fla chunk_gated_delta_rule_fwd_kkt_solve",
    "fla recompute_w_u_fwd",
    "fla chunk_gated_delta_rule_fwd_h",
    "fla chunk_fwd_o",
]


@pytest.mark.skipif(
    not (FLA_DIR / "fla").is_dir(),
    reason="flash-linear-attention is not in .fla/: pip install --no-deps --target .fla "
    "flash-linear-attention==0.6.0 fla-core==0.6.0 einops (as .ci/run does)",
)
def test_fla_gated_delta_kernels_compile_for_sm90_and_sm80() -> None:
    """benchmarks/fla_compile.py compiles fla's fused recurrent kernel and every kernel of its chunked forward
    for both targets (about 20 s on 2 CPUs; without TRITON_INTERPRET, which compiles nothing)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FLA_DIR), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "openinfer.benchmarks.fla_compile", "--targets", "90", "80"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| fla ")]
    compiled = {(row.split(" | ")[0][2:], row.split(" | ")[2]) for row in rows if " | - | " not in row}
    assert compiled == {(kernel, target) for kernel in FLA_KERNELS for target in ("sm_90", "sm_80")}, rows
    assert "14 launches compiled, 0 failing to compile" in done.stdout
