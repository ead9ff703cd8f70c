"""kernels/gated_delta.py's two forms of the gated delta rule, one linear-attention layer at Qwen3.5-4B-like head
sizes (Hk 16, Hv 32, Dk = Dv 128, float32, CPU), each forced on every step; and the conv on its own; not a test.

    python benchmarks/gated_delta.py --num-threads 1

Steps: decode of B requests (one token each, from stored states, each storing its state), verification of B
requests of q tokens (storing every token's state) and one prefill of T tokens from zeros storing its last.
"recurrent" is the batched per-position loop (what steps of at most RECURRENT_MAX_QUERY_LEN tokens a request
run), "chunked" the per-request chunked form (chunks of 64; a decode token is one padded chunk); "conv" is
causal_conv1d over the 2 * 16 * 128 + 32 * 128 = 8192 q/k/v channels, kernel 4, on the path the step takes.
Each cell the median milliseconds of `--iters` calls (verify, prefill: a fifth).
"""

from __future__ import annotations

from functools import partial

import torch

from openinfer.benchmarks.model_step import median_ms, timing_parser
from openinfer.kernels.gated_delta import causal_conv1d, gated_delta_rule
from openinfer.kernels.state_index import RECURRENT_MAX_QUERY_LEN, StateIndex

HK, HV, DK, DV, WIDTH = 16, 32, 128, 128, 4  # Qwen3.5-4B's linear-attention layers
CHANNELS = 2 * HK * DK + HV * DV
DECODE_BATCHES = (1, 8, 32)
VERIFY = ((8, 8),)  # (B, q): q = 7 draft tokens + 1, every token's state stored
PREFILL_LENS = (256, 1024)
ALWAYS_RECURRENT, NEVER_RECURRENT = 1 << 30, 0  # recurrent_max_query_len forcing one form


def step_index(lengths: list[int], from_state: bool, every_token: bool) -> StateIndex:
    """Request b reads slot b (or starts from zeros) and writes its last state, or each token's, after the B
    read slots."""
    loc = [0]
    for n in lengths:
        loc.append(loc[-1] + n)
    writes = [-1] * loc[-1]
    for b in range(len(lengths)):
        for t in range(loc[b] if every_token else loc[b + 1] - 1, loc[b + 1]):
            writes[t] = len(lengths) + t
    reads = list(range(len(lengths))) if from_state else [-1] * len(lengths)
    return StateIndex.build(loc, reads, writes, torch.device("cpu"))


def step_ms(
    lengths: list[int], from_state: bool, every_token: bool, warmup: int, iters: int
) -> tuple[float, float, float]:
    """ms of the recurrent form, the chunked form and the conv for one step of these request lengths."""
    g = torch.Generator().manual_seed(0)
    n, batch = sum(lengths), len(lengths)
    q, k = torch.randn(n, HK, DK, generator=g), torch.randn(n, HK, DK, generator=g)
    v = torch.randn(n, HV, DV, generator=g)
    decay = -torch.rand(n, HV, generator=g)
    beta = torch.rand(n, HV, generator=g)
    slots = batch + n  # B read slots, then one per token
    state = torch.randn(slots, HV, DK, DV, generator=g) * 0.1
    index = step_index(lengths, from_state, every_token)
    delta = partial(gated_delta_rule, q, k, v, decay, beta, state, index)
    recurrent, chunked = (
        median_ms(partial(delta, recurrent_max_query_len=limit), warmup, iters)
        for limit in (ALWAYS_RECURRENT, NEVER_RECURRENT)
    )
    x, weight = torch.randn(n, CHANNELS, generator=g), torch.randn(CHANNELS, WIDTH, generator=g)
    conv_state = torch.randn(slots, CHANNELS, WIDTH - 1, generator=g)
    conv = median_ms(partial(causal_conv1d, x, weight, conv_state, index), warmup, iters)
    return recurrent, chunked, conv


def main() -> None:
    parser = timing_parser(__doc__, warmup=3, iters=20, longer="a fifth")
    args = parser.parse_args()
    torch.set_num_threads(args.num_threads)
    rows = {f"decode B={b}": step_ms([1] * b, True, False, args.warmup, args.iters) for b in DECODE_BATCHES}
    for b, q in VERIFY:
        rows[f"verify B={b} q={q}"] = step_ms([q] * b, True, True, 1, max(1, args.iters // 5))
    for length in PREFILL_LENS:
        rows[f"prefill {length}"] = step_ms([length], False, False, 1, max(1, args.iters // 5))
    print(
        f"one gated-delta layer (Hk {HK}, Hv {HV}, Dk = Dv {DK}), float32, {args.num_threads} thread(s), "
        f"ms (median); steps up to {RECURRENT_MAX_QUERY_LEN} tokens a request run the recurrent form\n"
    )
    print("| step | recurrent | chunked | conv (8192 ch, kernel 4) |\n|---|---:|---:|---:|")
    for name, (recurrent, chunked, conv) in rows.items():
        print(f"| {name} | {recurrent:.2f} | {chunked:.2f} | {conv:.3f} |")


if __name__ == "__main__":
    main()
