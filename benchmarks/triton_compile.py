"""Compiles every Triton kernel of the project for sm_90 (H100/H200) and sm_80 (A100), at the specializations
the engine launches, on a machine without a GPU (ptxas ships in Triton's wheel), and prints a markdown table
of registers, spills and shared memory per launch. Exits non-zero on a compile error, a spill in an attention,
MoE, gated delta or causal conv kernel, or shared memory past the target's per-block limit.

    python -m openinfer.benchmarks.triton_compile [--targets 90 80] [--subset ci]

The launches come from the backends' own launch builders (`write_kv_launch`, `attention_launches`,
`block_attention_launch`, the fused-MoE `moe_launches`, the gated delta rule's `gated_delta_launches`, the causal conv's
`causal_conv1d_launches`) applied
to small example tensors shaped as the engine shapes them (q/k/v views of one projection, int64 block tables),
so the signature, integer specializations and constexprs are the ones a real launch computes. TRITON_INTERPRET
must be unset (the interpreter compiles nothing).
"""

from __future__ import annotations

import argparse
import enum
import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from openinfer.kernels.attention_metadata import AttentionMetadata
from openinfer.kernels.state_index import StateIndex
from openinfer.kernels.triton_attention import attention_launches, write_kv_launch
from openinfer.kernels.triton_causal_conv1d import causal_conv1d_launches
from openinfer.kernels.triton_dflash_attention import block_attention_launch
from openinfer.kernels.triton_gated_delta import gated_delta_launches, read_conflicts
from openinfer.kernels.triton_launch import CompiledLaunch, KernelLaunch, compile_launch
from openinfer.kernels.triton_moe import moe_launches

SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}  # bytes of shared memory one block may use
NUM_KV_HEADS = 8  # every Qwen3 size; num_heads = GROUP * 8
NUM_KV_SPLITS = 8  # TritonAttentionBackend's default
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# The MoE, gated delta and causal conv kernels' (dtype, tokens) points: the 16-bit dtypes the MoE and Qwen3.5
# targets ship in; 1 token (decode) and 8 (MoE prefill's 64-row blocks over 8 pairs each, the hybrids' verify)
HALF_STEPS = list(itertools.product(("bf16", "fp16"), (1, 8)))


class Subset(enum.Enum):
    FULL = "full"  # the whole matrix (the benchmark's default)
    CI = (
        "ci"  # the heaviest head dim at every dtype and the GQA extremes (the test's: under ~2 min on 2 CPUs)
    )


@dataclass(frozen=True)
class Spec:
    """One specialization: what varies between the engine's launches of the attention kernels."""

    head_dim: int
    group: int  # query heads per KV head
    dtype: str  # the KV cache's (and the model's) dtype, a DTYPES key
    block_size: int  # --block-size (the DFlash cache's page size is the target's block size)
    table_width: int  # block-table columns: 1 and multiples of 16 are specialized by Triton
    block_width: int = 16  # DFlash's T (num_spec_tokens + 1)

    def __str__(self) -> str:
        shape = f"d{self.head_dim} g{self.group} {self.dtype}"
        return f"{shape} bs{self.block_size} w{self.table_width} T{self.block_width}"


@dataclass(frozen=True)
class MoeSpec:
    """One specialization of the fused-MoE kernels: a Qwen3-30B-A3B layer's sizes (over 2 of its experts: the
    expert count is a grid size, not a specialization) at a dtype and a step size."""

    dtype: str  # the model's dtype, a DTYPES key
    num_tokens: int  # 1: decode's 16-row blocks; 8 (64 pairs over 2 experts): prefill's 64-row blocks
    hidden_size: int = 2048
    inter_size: int = 768  # moe_intermediate_size
    top_k: int = 8

    def __str__(self) -> str:
        return f"H{self.hidden_size} I{self.inter_size} k{self.top_k} T{self.num_tokens} {self.dtype}"


@dataclass(frozen=True)
class GatedDeltaSpec:
    """One specialization of the recurrent gated delta rule: a Qwen3.5-4B linear-attention layer's heads at a
    dtype and a step's longest request (decode's 1, verification's 8)."""

    dtype: str  # the model's dtype, a DTYPES key (the state is float32 whatever it is)
    max_query_len: int
    key_heads: int = 16
    value_heads: int = 32
    head_dim: int = 128  # Dk = Dv

    def __str__(self) -> str:
        heads = f"Hk{self.key_heads} Hv{self.value_heads} D{self.head_dim}"
        return f"{heads} L{self.max_query_len} {self.dtype}"


@dataclass(frozen=True)
class CausalConvSpec:
    """One specialization of the causal conv: a Qwen3.5-4B linear-attention layer's q/k/v channels (2 * 16 * 128
    + 32 * 128) at a dtype and a step's longest request (decode's 1, verification's 8)."""

    dtype: str  # the model's dtype, a DTYPES key (the conv state's too)
    max_query_len: int
    channels: int = 8192
    width: int = 4  # conv kernel size
    projection: int = 8192 + 4096 + 2 * 32  # in_proj's output row: conv channels, z, b, a

    def __str__(self) -> str:
        return f"C{self.channels} W{self.width} L{self.max_query_len} {self.dtype}"


AnySpec = Spec | MoeSpec | GatedDeltaSpec | CausalConvSpec


@dataclass(frozen=True)
class Row:
    kernel: str
    spec: AnySpec
    target: int
    result: CompiledLaunch | None
    error: str | None

    def problem(self) -> str | None:
        """Why this row fails the check, or None."""
        if self.result is None:
            return f"compile error: {self.error}"
        spill_checked = ("attention", "moe", "gated_delta", "causal_conv1d")
        if self.result.spill_bytes and any(name in self.kernel for name in spill_checked):
            return f"{self.result.spill_bytes} bytes spilled"
        if self.result.shared_bytes > SHARED_LIMIT[self.target]:
            return f"{self.result.shared_bytes} bytes of shared memory > {SHARED_LIMIT[self.target]}"
        return None


def specs(subset: Subset) -> Iterator[Spec]:
    """The matrix: head dims 64/128 (128 is also the DFlash drafters'), GQA groups 1/2/4/8, the three cache
    dtypes, block sizes 16/32 with a general table width; then other block sizes, table widths 1 and 16 and
    DFlash block widths at the heaviest point (head_dim 128, bf16, group 4)."""
    if subset is Subset.CI:
        for dtype, group in itertools.product(DTYPES, (1, 8)):
            yield Spec(128, group, dtype, 16, 3)
        return
    for head_dim, group, dtype, block_size in itertools.product((64, 128), (1, 2, 4, 8), DTYPES, (16, 32)):
        yield Spec(head_dim, group, dtype, block_size, 3)
    for block_size in (1, 8, 24, 64, 128, 256):
        yield Spec(128, 4, "bf16", block_size, 3)
    for table_width in (1, 16):
        yield Spec(128, 4, "bf16", 16, table_width)
    for block_width in (1, 4, 8, 33):
        yield Spec(128, 4, "bf16", 16, 3, block_width)


def launches(spec: Spec) -> Iterator[tuple[str, KernelLaunch]]:
    """The engine's launches at `spec`, built by the backends' launch builders from CPU example tensors."""
    dtype, d, kv = DTYPES[spec.dtype], spec.head_dim, NUM_KV_HEADS
    heads = spec.group * kv
    cache = torch.empty(2, 4 * spec.table_width, spec.block_size, kv, d, dtype=dtype)
    capacity = spec.table_width * spec.block_size  # token positions a request's table can hold
    decodes = [(min(5, capacity - 1), 1), (min(9, capacity - 1), 1)]  # (context, query) per request
    context = min(2, capacity - 1)
    varlen = [(0, min(3, capacity)), (context, min(8, capacity - context))]
    for name, requests in (("decode", decodes), ("varlen", varlen)):
        step_tables = [[0] * spec.table_width for _ in requests]  # as wide as the step's longest table
        meta = AttentionMetadata.build(
            [c for c, _ in requests],
            [q for _, q in requests],
            step_tables,
            spec.block_size,
            torch.device("cpu"),
        )
        qkv = torch.empty(meta.num_tokens, heads + 2 * kv, d, dtype=dtype)  # (n, heads + 2 * kv_heads, d)
        q, k, v = qkv.split([heads, kv, kv], dim=1)  # views, strided as the model's
        if name == "decode":
            yield "write_kv", write_kv_launch(cache, k, v, meta.slot_mapping)
        _, steps = attention_launches(q, cache, meta, 0.1, NUM_KV_SPLITS)
        yield f"paged_attention {name}", steps[0]
        if len(steps) > 1:
            yield "combine_splits", steps[1]
    b, t = 2, spec.block_width
    q = torch.empty(b, t, heads, d, dtype=dtype)
    k, v = torch.empty(b, t, kv, d, dtype=dtype), torch.empty(b, t, kv, d, dtype=dtype)
    tables = torch.zeros(b, spec.table_width, dtype=torch.int64)
    lens = torch.zeros(b, dtype=torch.int64)
    yield (
        "dflash_block_attention",
        block_attention_launch(q.new_empty(q.shape), q, k, v, cache, tables, lens, lens, 0.1),
    )


def moe_kernel_launches(spec: MoeSpec) -> Iterator[tuple[str, KernelLaunch]]:
    """fused_experts_triton's two launches at `spec`, from CPU example tensors (every pair on expert 0)."""
    dtype, t, h, i, k = DTYPES[spec.dtype], spec.num_tokens, spec.hidden_size, spec.inter_size, spec.top_k
    experts = 2
    hidden = torch.empty(t, h, dtype=dtype)
    w13, w2 = torch.empty(experts, 2 * i, h, dtype=dtype), torch.empty(experts, h, i, dtype=dtype)
    weights, ids = torch.empty(t, k), torch.zeros(t, k, dtype=torch.int64)
    act, out = torch.empty(t * k, i, dtype=dtype), torch.empty(t * k, h)
    gate_up, down = moe_launches(hidden, w13, w2, weights, ids, act, out)
    yield "moe_gate_up", gate_up
    yield "moe_down", down


def gated_delta_kernel_launches(spec: GatedDeltaSpec) -> Iterator[tuple[str, KernelLaunch]]:
    """gated_delta_rule_triton's two launches at `spec`, for 2 requests of max_query_len tokens each, from CPU
    example tensors (q/k/v views of one projection, as the model splits it)."""
    dtype, d, length = DTYPES[spec.dtype], spec.head_dim, spec.max_query_len
    hk, hv, n = spec.key_heads, spec.value_heads, 2 * length
    mixed = torch.empty(n, (2 * hk + hv) * d, dtype=dtype)
    q, k, v = (x.view(n, -1, d) for x in mixed.split([hk * d, hk * d, hv * d], dim=1))
    g, beta = torch.empty(n, hv), torch.empty(n, hv, dtype=dtype)
    state = torch.empty(4, hv, d, d)
    index = StateIndex.build([0, length, n], [0, 1], [2] * length + [3] * length, torch.device("cpu"))
    out, saved = torch.empty(n, hv, d, dtype=dtype), torch.empty(2, hv, d, d)
    save, recur = gated_delta_launches(q, k, v, g, beta, state, index, out, saved, read_conflicts(index))
    yield "gated_delta_save", save
    yield "gated_delta_recurrent", recur


def causal_conv_kernel_launches(spec: CausalConvSpec) -> Iterator[tuple[str, KernelLaunch]]:
    """causal_conv1d_triton's two launches at `spec`, for 2 requests of max_query_len tokens each, from CPU
    example tensors (x a view of the in_proj output, the weight a view of the conv1d's (C, 1, W) one)."""
    dtype, c, width, length = DTYPES[spec.dtype], spec.channels, spec.width, spec.max_query_len
    n = 2 * length
    x = torch.empty(n, spec.projection, dtype=dtype)[:, :c]
    weight = torch.empty(c, 1, width, dtype=dtype)[:, 0]
    conv_state = torch.empty(4, c, width - 1, dtype=dtype)
    index = StateIndex.build([0, length, n], [0, 1], [2] * length + [3] * length, torch.device("cpu"))
    out, saved = torch.empty(n, c, dtype=dtype), torch.empty(2, c, width - 1, dtype=dtype)
    save, conv = causal_conv1d_launches(x, weight, conv_state, index, out, saved, read_conflicts(index))
    yield "causal_conv1d_save", save
    yield "causal_conv1d", conv


def all_launches(subset: Subset) -> Iterator[tuple[AnySpec, str, KernelLaunch]]:
    """The attention kernels' launches over the subset's specs, then the fused-MoE kernels', then the gated
    delta rule's, then the causal conv's."""
    for spec in specs(subset):
        for kernel, launch in launches(spec):
            yield spec, kernel, launch
    for moe_spec in (MoeSpec(*step) for step in HALF_STEPS):
        for kernel, launch in moe_kernel_launches(moe_spec):
            yield moe_spec, kernel, launch
    for delta_spec in (GatedDeltaSpec(*step) for step in HALF_STEPS):
        for kernel, launch in gated_delta_kernel_launches(delta_spec):
            yield delta_spec, kernel, launch
    for conv_spec in (CausalConvSpec(*step) for step in HALF_STEPS):
        for kernel, launch in causal_conv_kernel_launches(conv_spec):
            yield conv_spec, kernel, launch


def specialization(launch: KernelLaunch) -> tuple[object, ...]:
    """What tells two launches' compilations apart: the constexprs, the tensors' dtypes and the integers as
    Triton specializes them (equal to 1, a multiple of 16, or neither)."""
    args = tuple(
        str(a.dtype)
        if isinstance(a, torch.Tensor)
        else (a == 1, a % 16 == 0)
        if isinstance(a, int)
        else type(a)
        for a in launch.args
    )
    return (args, tuple(sorted((k, str(v)) for k, v in launch.constexprs.items())), launch.num_warps)


def check(targets: list[int], subset: Subset) -> list[Row]:
    """Every launch of every spec compiled for every target; a failed compile is a row with its error."""
    rows, seen = [], set()
    for spec, kernel, launch in all_launches(subset):
        for target in targets:
            key = (kernel, target, specialization(launch))
            if key in seen:  # write_kv and combine_splits do not depend on the GQA group, say
                continue
            seen.add(key)
            rows.append(compiled_row(kernel, spec, target, launch))
    return rows


def compiled_row(kernel: str, spec: AnySpec, target: int, launch: KernelLaunch) -> Row:
    """`launch` compiled for sm_`target`; a failed compile is a row with its error's first line."""
    try:
        return Row(kernel, spec, target, compile_launch(launch, target), None)
    except Exception as error:  # noqa: BLE001 - any compile failure is a row of the report
        return Row(kernel, spec, target, None, f"{type(error).__name__}: {error}".splitlines()[0])


def table(rows: list[Row]) -> str:
    lines = [
        "| kernel | specialization | target | registers | spills (bytes) | shared (bytes) | compile s | check |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        r = row.result
        cells = (
            [str(r.registers), str(r.spill_bytes), str(r.shared_bytes), f"{r.seconds:.2f}"]
            if r
            else ["-"] * 4
        )
        lines.append(
            f"| {row.kernel} | {row.spec} | sm_{row.target} | {' | '.join(cells)} | {row.problem() or 'ok'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: prints the table and a summary; exit status 1 if any row fails the check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[90, 80], choices=sorted(SHARED_LIMIT))
    parser.add_argument("--subset", type=Subset, default=Subset.FULL, choices=list(Subset))
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("unset TRITON_INTERPRET: the interpreter compiles nothing")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    rows = check(args.targets, args.subset)
    return report(rows, [(row, problem) for row in rows if (problem := row.problem())], "failing the check")


def report(rows: list[Row], failures: list[tuple[Row, str]], failing: str) -> int:
    """Print the table, a summary (`failing`: what the failing rows failed) and a line per failure on stderr;
    the exit status, 1 if any row failed."""
    print(table(rows))
    print(f"\n{len(rows)} launches compiled, {len(failures)} {failing}")
    for row, why in failures:
        print(f"FAIL {row.kernel} {row.spec} sm_{row.target}: {why}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
