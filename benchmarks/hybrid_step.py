"""One engine step of Qwen3.5's hybrid layer stack (3 Gated DeltaNet layers + 1 gated full-attention layer)
against a Qwen3 stack of 4 full-attention layers of the same width (CPU, float32); not a test.

    python benchmarks/hybrid_step.py --num-threads 1

Two sizes, each a pair of random checkpoints:

- tiny: the built-in architecture (hidden 256, 4 layers, 4 query heads over 2 KV heads of 64, MLP 768,
  vocabulary 512) as Qwen3 and as Qwen3.5, whose DeltaNet layers have 2 key heads and 4 value heads of 64;
- 4B: Qwen3.5-4B's layer shapes (hidden 2560; full attention 16 query heads over 4 KV heads of 256, a quarter
  of each head rotated, with the output gate; DeltaNet 16 key heads and 32 value heads of 128, conv kernel 4;
  MLP 9216) against Qwen3-4B's attention (32 query heads over 8 KV heads of 128: the same 4096 query and 1024
  key/value widths) with Qwen3.5-4B's MLP of 9216 (Qwen3-4B's is 9728), so that the two differ only in their
  token mixers. 4 layers each, and a vocabulary of 4096 (the releases' 248320 and 151936 would make the
  LM head most of a 4-layer step).

Steps are `model_step.py`'s: decode of B requests at ~64 tokens of context, and one prefill from position 0;
each cell the median milliseconds of `--iters` calls (prefill: a tenth; the 4B pair: a fifth of each). The
layer table times each token mixer inside the same steps (forward hooks, run after the step timings): one
DeltaNet layer (projections, conv, gated delta rule, gated norm, output projection) against one full-attention
layer (projections, RoPE, attention over the paged cache, output projection), medians over all its calls.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from openinfer.benchmarks.model_step import (
    BLOCK_SIZE,
    CONTEXT_LEN,
    DECODE_BATCHES,
    decode_step,
    median_ms,
    prefill_step,
    timing_parser,
)
from openinfer.engine_core.models.gated_deltanet import GatedDeltaNet
from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.models.qwen3 import Qwen3Attention
from openinfer.engine_core.models.qwen3_5 import GatedAttention
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner

# 3 DeltaNet layers then a full-attention one (the releases' full_attention_interval 4)
HYBRID_STACK = {
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
}
PREFILL_LENS = (256, 1024)
MIXERS: dict[type[nn.Module], str] = {
    GatedDeltaNet: "DeltaNet",
    GatedAttention: "gated attention",
    Qwen3Attention: "attention",
}


def rope(theta: float, sections: list[int]) -> dict[str, Any]:
    """Qwen3.5's rope_parameters rotating a quarter of each head, as the releases, in interleaved multimodal
    `sections` summing to half the rotated dims (text positions make them agree)."""
    return {
        "rope_type": "default",
        "rope_theta": theta,
        "partial_rotary_factor": 0.25,
        "mrope_section": sections,
        "mrope_interleaved": True,
    }


@dataclass(frozen=True)
class Pair:
    """A Qwen3 checkpoint's and a Qwen3.5 checkpoint's config overrides, and how they are drawn."""

    name: str
    qwen3: dict[str, Any]  # make_tiny_checkpoint overrides (on the built-in architecture)
    qwen3_5: dict[str, Any]  # make_tiny_qwen3_5_checkpoint overrides (on SMALL_QWEN3_5)
    init_std: float  # 0.2 widens the tiny models' logits; at hidden 2560 it would overflow float32

    def write(self, folder: Path) -> tuple[Path, Path]:
        dense = make_tiny_checkpoint(folder / "qwen3", overrides=self.qwen3, init_std=self.init_std)
        hybrid = make_tiny_qwen3_5_checkpoint(
            folder / "qwen3_5", overrides=self.qwen3_5, init_std=self.init_std, layout="causal_lm"
        )
        return dense, hybrid


TINY = Pair(
    "tiny (hidden 256)",
    {},  # the built-in architecture
    {
        **HYBRID_STACK, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "intermediate_size": 768, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 64, "linear_value_head_dim": 64, "tie_word_embeddings": True,
        "rope_parameters": rope(10000.0, [3, 3, 2]),
    },
    init_std=0.2,
)  # fmt: skip
SHAPED_4B = Pair(
    "4B-shaped (hidden 2560)",
    {
        "vocab_size": 4096, "hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 9216, "rope_theta": 1000000.0,
    },
    {
        **HYBRID_STACK, "vocab_size": 4096, "hidden_size": 2560, "num_attention_heads": 16, "num_key_value_heads": 4,
        "head_dim": 256, "intermediate_size": 9216, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "tie_word_embeddings": True,
        "rope_parameters": rope(10000000.0, [11, 11, 10]),
    },
    init_std=0.02,
)  # fmt: skip


def steps(runner: ModelRunner, prefills: Sequence[int]) -> dict[str, Callable[[], object]]:
    """model_step.py's decode steps, then one prefill per length."""
    table = {f"decode B={b}": decode_step(runner, b) for b in DECODE_BATCHES}
    return table | {f"prefill {n}": prefill_step(runner, n) for n in prefills}


def mixer_ms(model: nn.Module, step: Callable[[], object], iters: int) -> dict[str, float]:
    """Median ms of one call of each kind of token mixer in `model` over `iters` calls of `step`."""
    times: dict[str, list[float]] = defaultdict(list)
    started: dict[nn.Module, float] = {}

    def before(module: nn.Module, _: object) -> None:
        started[module] = time.perf_counter()

    def after(module: nn.Module, _: object, __: object) -> None:
        times[MIXERS[type(module)]].append(time.perf_counter() - started[module])

    hooks = [
        hook
        for module in model.modules()
        if type(module) in MIXERS
        for hook in (module.register_forward_pre_hook(before), module.register_forward_hook(after))
    ]
    try:
        step()  # warm
        times.clear()
        for _ in range(iters):
            step()
    finally:
        for hook in hooks:
            hook.remove()
    return {kind: statistics.median(ts) * 1e3 for kind, ts in times.items()}


def time_model(
    folder: Path, prefills: Sequence[int], warmup: int, iters: int
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(ms per step, ms per mixer kind per step) of the checkpoint in `folder`."""
    num_blocks = max(DECODE_BATCHES) * -(-(CONTEXT_LEN + 1) // BLOCK_SIZE) + max(prefills) // BLOCK_SIZE
    # a state group per decode request (Qwen3's runner ignores it)
    states = StateGeometry(max(DECODE_BATCHES), 1)
    runner = ModelRunner(
        folder, torch.device("cpu"), num_blocks, BLOCK_SIZE, torch.float32, state_geometry=states
    )
    step_ms: dict[str, float] = {}
    mixers: dict[str, dict[str, float]] = {}
    for name, step in steps(runner, prefills).items():
        decode = name.startswith("decode")
        n = iters if decode else max(1, iters // 10)
        step_ms[name] = median_ms(step, warmup if decode else max(1, warmup // 4), n)
        mixers[name] = mixer_ms(runner.model, step, max(1, n // 2))
    del runner
    gc.collect()  # the 4B pair's runners hold ~4 GB each (weights and their packed copies)
    return step_ms, mixers


def print_pair(pair: Pair, prefills: Sequence[int], warmup: int, iters: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        dense, hybrid = pair.write(Path(tmp))
        written = time.perf_counter() - start
        dense_ms, dense_mixers = time_model(dense, prefills, warmup, iters)
        hybrid_ms, hybrid_mixers = time_model(hybrid, prefills, warmup, iters)
    print(f"\n{pair.name}: one ModelRunner.execute, ms (median; checkpoints written in {written:.0f} s)\n")
    print("| step | Qwen3 (4 attention) | Qwen3.5 (3 DeltaNet + 1 attention) | Qwen3.5 / Qwen3 |")
    print("|---|---:|---:|---:|")
    for name, ms in dense_ms.items():
        print(f"| {name} | {ms:.2f} | {hybrid_ms[name]:.2f} | {hybrid_ms[name] / ms:.2f}x |")
    print(f"\n{pair.name}: one layer's token mixer within those steps, ms (median)\n")
    print("| step | Qwen3 attention | Qwen3.5 DeltaNet | Qwen3.5 gated attention |\n|---|---:|---:|---:|")
    for name, kinds in dense_mixers.items():
        mine = hybrid_mixers[name]
        print(
            f"| {name} | {kinds['attention']:.3f} | {mine['DeltaNet']:.3f} | {mine['gated attention']:.3f} |"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = timing_parser(__doc__, warmup=8, iters=60, longer="a tenth")
    parser.add_argument("--prefill", type=int, nargs="+", default=list(PREFILL_LENS), help="prefill lengths")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "4b"], choices=["tiny", "4b"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.num_threads)
    print(f"float32, {args.num_threads} thread(s), decode at ~{CONTEXT_LEN} tokens of context")
    if "tiny" in args.sizes:
        print_pair(TINY, args.prefill, args.warmup, args.iters)
    if "4b" in args.sizes:  # a step is 10-100x the tiny one's
        print_pair(SHAPED_4B, args.prefill, max(1, args.warmup // 4), max(1, args.iters // 5))


if __name__ == "__main__":
    main()
