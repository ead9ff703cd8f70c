"""Compiles flash-linear-attention's gated delta rule forward kernels (the fused recurrent one and those its chunked
forward runs) for sm_90 and sm_80 without a GPU, as triton_compile.py compiles ours, and prints the same table.
Exits non-zero on a compile error; spills and shared memory are reported, not failed: these kernels are fla's.

    PYTHONPATH=.fla python -m openinfer.benchmarks.fla_compile [--targets 90 80]

fla is imported from PYTHONPATH (.ci/run installs it into .fla/, never the venv). Each launch is built as fla's
host function builds it (same keyword arguments, from CPU tensors at Qwen3.5-4B's heads, bf16), then fla's own
@triton.heuristics lambdas set their constexprs and the first @triton.autotune config its tile and warps (not
necessarily the one fla's autotuner picks on a GPU: the kkt + solve_tril kernel's, one warp, spills ~450 bytes).
The arguments are the engine's: varlen (cu_seqlens), a float32 log-decay g, initial and final states, q/k
L2-normalized in the kernel where that is an argument (otherwise by fla's l2norm_fwd kernel, which runs first).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
import triton
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.jit import JITFunction

from openinfer.benchmarks.triton_compile import SHARED_LIMIT, GatedDeltaSpec, Row, compiled_row, report
from openinfer.kernels.triton_launch import KernelLaunch

CHUNK = 64  # fla's chunk size (BT); 64 takes the fused kkt + solve_tril kernel
LENGTHS = [70, 33]  # a varlen batch of two requests: two chunks, then one partial chunk
VERIFY_LENGTH = (
    8  # the fused recurrent kernel's requests (T is not specialized: decode's 1 compiles the same)
)


def fla_launch(kernel: Any, **kwargs: object) -> KernelLaunch:
    """``kernel[grid](**kwargs)`` as fla launches it, its wrappers unwrapped: each @triton.heuristics sets its
    constexprs from the arguments, each @triton.autotune contributes its first config."""
    options: dict[str, Any] = {"num_warps": 4, "num_stages": 3}  # Triton's defaults
    options.update({k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs})
    while not isinstance(kernel, JITFunction):
        if isinstance(kernel, Heuristics):
            kwargs.update({name: rule(kwargs) for name, rule in kernel.values.items()})
        elif isinstance(kernel, Autotuner):
            config = kernel.configs[0]
            kwargs.update(config.kwargs)
            options.update(num_warps=config.num_warps, num_stages=config.num_stages)
        kernel = kernel.fn
    args = tuple(kwargs[p.name] for p in kernel.params if not p.is_constexpr)
    constexprs = {p.name: kwargs[p.name] for p in kernel.params if p.is_constexpr}
    return KernelLaunch(kernel, (1,), args, constexprs, options["num_warps"], options["num_stages"])


def recurrent_launch(spec: GatedDeltaSpec) -> KernelLaunch:
    """fused_recurrent_gated_delta_rule_fwd's launch for two requests of spec.max_query_len tokens."""
    from fla.ops.gated_delta_rule.fused_recurrent import (  # type: ignore[import-not-found]
        fused_recurrent_gated_delta_rule_fwd_kernel,
    )

    dtype, d, hk, hv = torch.bfloat16, spec.head_dim, spec.key_heads, spec.value_heads
    n = 2 * spec.max_query_len
    q, k = torch.empty(1, n, hk, d, dtype=dtype), torch.empty(1, n, hk, d, dtype=dtype)  # (1, n, Hk, K)
    v = torch.empty(1, n, hv, d, dtype=dtype)  # (1, n, Hv, V)
    g, beta = torch.empty(1, n, hv), torch.empty(1, n, hv, dtype=dtype)  # (1, n, Hv): g is float32
    states = torch.empty(2, 2, hv, d, d)  # (initial and final, N, Hv, K, V) float32
    return fla_launch(
        fused_recurrent_gated_delta_rule_fwd_kernel,
        q=q, k=k, v=v, g=g, gk=None, gv=None, beta=beta, A_log=None, dt_bias=None, o=torch.empty_like(v),
        h0=states[0], ht=states[1], cu_seqlens=torch.tensor([0, n // 2, n]), scale=d**-0.5, T=n,
        H=hk, HV=hv, K=d, V=d, BK=triton.next_power_of_2(d), BV=min(8, triton.next_power_of_2(d)),
        IS_BETA_HEADWISE=False, USE_QK_L2NORM_IN_KERNEL=True, APPLY_BETA_SIGMOID=False,
        ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=False, num_warps=1, num_stages=3,
    )  # fmt: skip


def chunk_launches(spec: GatedDeltaSpec) -> Iterator[tuple[str, KernelLaunch]]:
    """The launches of chunk_gated_delta_rule's forward, in order, for a varlen batch of LENGTHS."""
    from fla.modules.norm.l2norm import l2norm_fwd_kernel  # type: ignore[import-not-found]
    from fla.ops.common.chunk_delta_h import (  # type: ignore[import-not-found]
        chunk_gated_delta_rule_fwd_kernel_h_blockdim64,
    )
    from fla.ops.common.chunk_o import chunk_fwd_kernel_o  # type: ignore[import-not-found]
    from fla.ops.gated_delta_rule.chunk_fwd import (  # type: ignore[import-not-found]
        chunk_gated_delta_rule_fwd_kkt_solve_kernel,
    )
    from fla.ops.gated_delta_rule.wy_fast import recompute_w_u_fwd_kernel  # type: ignore[import-not-found]
    from fla.ops.utils.constant import RCP_LN2  # type: ignore[import-not-found]
    from fla.ops.utils.cumsum import chunk_local_cumsum_scalar_kernel  # type: ignore[import-not-found]
    from fla.ops.utils.index import (  # type: ignore[import-not-found]
        prepare_chunk_indices,
        prepare_chunk_offsets,
    )

    dtype, d, hk, hv, bt = torch.bfloat16, spec.head_dim, spec.key_heads, spec.value_heads, CHUNK
    t = sum(LENGTHS)
    cu_seqlens = torch.tensor([0, LENGTHS[0], t])
    chunk_indices = prepare_chunk_indices(cu_seqlens, bt)  # (NT, 2): (request, chunk) pairs
    nt = len(chunk_indices)
    q, k = torch.empty(1, t, hk, d, dtype=dtype), torch.empty(1, t, hk, d, dtype=dtype)  # (1, T, Hk, K)
    v = torch.empty(1, t, hv, d, dtype=dtype)  # (1, T, Hv, V)
    g, beta = torch.empty(1, t, hv), torch.empty(1, t, hv, dtype=dtype)  # (1, T, Hv): g is float32
    x = q.view(-1, d)  # l2norm_fwd's (T * Hk, K) rows
    yield "fla l2norm_fwd", fla_launch(
        l2norm_fwd_kernel, x=x, y=torch.empty_like(x), rstd=torch.empty(x.shape[0]), eps=1e-6,
        T=x.shape[0], D=d, BD=triton.next_power_of_2(d), NB=triton.cdiv(x.shape[0], 2048 * 32),
    )  # fmt: skip
    g_cum = torch.empty_like(g)  # float32 chunk-local cumsum of g, scaled to log2
    yield "fla chunk_local_cumsum", fla_launch(
        chunk_local_cumsum_scalar_kernel, s=g, o=g_cum, scale=RCP_LN2, cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices, T=t, B=1, H=hv, BT=bt, REVERSE=False, USE_GRAPH=False,
    )  # fmt: skip
    a = torch.empty(1, t, hv, bt, dtype=dtype)  # (1, T, Hv, BT): (I + A)^-1 per chunk
    yield "fla chunk_gated_delta_rule_fwd_kkt_solve", fla_launch(
        chunk_gated_delta_rule_fwd_kkt_solve_kernel, k=k, g=g_cum, beta=beta, A=a, cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices, T=t, H=hk, HV=hv, K=d, BT=bt, BC=16,
    )  # fmt: skip
    w, u = torch.empty(1, t, hv, d, dtype=dtype), torch.empty_like(v)  # (1, T, Hv, K), (1, T, Hv, V)
    yield "fla recompute_w_u_fwd", fla_launch(
        recompute_w_u_fwd_kernel, k=k, v=v, beta=beta, w=w, u=u, A=a, g=g_cum, cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices, T=t, H=hk, HV=hv, K=d, V=d, BT=bt, BK=64, BV=64,
    )  # fmt: skip
    h = torch.empty(1, nt, hv, d, d, dtype=dtype)  # (1, NT, Hv, K, V): the state before each chunk
    states = torch.empty(2, len(LENGTHS), hv, d, d)  # (initial and final, N, Hv, K, V) float32
    v_new = torch.empty_like(u)
    yield "fla chunk_gated_delta_rule_fwd_h", fla_launch(
        chunk_gated_delta_rule_fwd_kernel_h_blockdim64, k=k, v=u, w=w, v_new=v_new, g=g_cum, gk=None, h=h,
        h0=states[0], ht=states[1], cu_seqlens=cu_seqlens, chunk_offsets=prepare_chunk_offsets(cu_seqlens, bt),
        T=t, H=hk, HV=hv, K=d, V=d, BT=bt, STATE_V_FIRST=False,
    )  # fmt: skip
    yield "fla chunk_fwd_o", fla_launch(
        chunk_fwd_kernel_o, q=q, k=k, v=v_new, h=h, g=g_cum, g_gamma=None, o=torch.empty_like(v),
        cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, scale=d**-0.5, T=t, H=hk, HV=hv, K=d, V=d,
        BT=bt, STATE_V_FIRST=False,
    )  # fmt: skip


def all_launches() -> Iterator[tuple[GatedDeltaSpec, str, KernelLaunch]]:
    """The fused recurrent kernel, then the chunked forward's kernels."""
    spec = GatedDeltaSpec("bf16", VERIFY_LENGTH)
    yield spec, "fla fused_recurrent_gated_delta_rule_fwd", recurrent_launch(spec)
    spec = GatedDeltaSpec("bf16", max(LENGTHS))
    for kernel, launch in chunk_launches(spec):
        yield spec, kernel, launch


def check(targets: list[int]) -> list[Row]:
    """Every launch compiled for every target; a failed compile is a row with its error."""
    rows = []
    for spec, kernel, launch in all_launches():
        for target in targets:
            rows.append(compiled_row(kernel, spec, target, launch))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table and a summary; exit status 1 if any launch fails to compile."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[90, 80], choices=sorted(SHARED_LIMIT))
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("unset TRITON_INTERPRET: the interpreter compiles nothing")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    rows = check(args.targets)
    return report(rows, [(row, str(row.error)) for row in rows if row.result is None], "failing to compile")


if __name__ == "__main__":
    sys.exit(main())
