"""kernels/gated_delta.py against flash-linear-attention's fused recurrent gated delta rule (Triton, run on the
CPU under TRITON_INTERPRET=1), in a process of its own: with `fla` importable, transformers swaps its Qwen3.5
reference functions for fla's, which must not happen in the test process (test_fla_reference.py runs this).

    PYTHONPATH=.fla TRITON_INTERPRET=1 python tests/kernels/fla_check.py

Random varlen batches (request lengths for the batched recurrent form and for the per-request chunked form,
reads from zeros and from stored states, GQA) through both: prints the largest output and final-state
differences and exits 1 when either is above 1e-5.
"""

from __future__ import annotations

import sys

import torch
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

from openinfer.kernels.gated_delta import gated_delta_rule
from openinfer.kernels.state_index import StateIndex

HK, HV, DK, DV = 2, 4, 16, 8  # GQA: each q/k head serves 2 value heads
TOLERANCE = 1e-5


def compare(lengths: list[int], seed: int) -> tuple[float, float]:
    """Largest |ours - fla| over the outputs and over the final states of one batch."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    q, k = torch.randn(n, HK, DK, generator=g), torch.randn(n, HK, DK, generator=g)
    v = torch.randn(n, HV, DV, generator=g)
    decay = -torch.rand(n, HV, generator=g)  # log-decays in (-1, 0)
    beta = torch.rand(n, HV, generator=g)
    num = len(lengths)
    states = torch.randn(2 * num, HV, DK, DV, generator=g) * 0.5
    loc = [0]
    for length in lengths:
        loc.append(loc[-1] + length)
    reads = [-1 if b % 2 == 0 else b for b in range(num)]  # odd requests start from slot b
    writes = [-1] * n
    for b in range(num):
        writes[loc[b + 1] - 1] = num + b  # each request's final state into slot num + b
    h0 = torch.stack([states[r] if r >= 0 else torch.zeros_like(states[0]) for r in reads])
    out_fla, final_fla = fused_recurrent_gated_delta_rule(
        q[None], k[None], v[None], g=decay[None], beta=beta[None], initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(loc),
    )  # fmt: skip
    out = gated_delta_rule(q, k, v, decay, beta, states, StateIndex.build(loc, reads, writes, q.device))
    out_error = (out - out_fla[0]).abs().max().item()
    state_error = (states[num:] - final_fla).abs().max().item()
    return out_error, state_error


def main() -> int:
    failed = False
    for name, lengths in (("recurrent", [3, 1, 5, 16]), ("chunked", [70, 2, 33])):
        out_error, state_error = compare(lengths, seed=len(lengths))
        print(f"{name} {lengths}: outputs {out_error:.2e}, final states {state_error:.2e}")
        failed |= max(out_error, state_error) > TOLERANCE
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
