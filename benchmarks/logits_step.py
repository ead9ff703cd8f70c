"""What the logits processors cost per engine step: requests with penalties against the same requests without;
not a test.

    python benchmarks/logits_step.py [--batch-sizes 1 8 32] [--vocab-sizes 512 151936] [--rounds 5]

B greedy requests (``--prompt-len``-token prompts, prefilled first) decode in one engine core, in this process,
with and without drafts (K cycle drafts per request per step, as ``engine_step.py``'s). "plain" requests set
nothing; "penalised" ones set repetition, presence and frequency penalties, a 3-token logit_bias, two bad
words and a min_tokens never reached (its stop token masked at every row). Each cell is the median over
``--rounds`` interleaved rounds of ``--steps`` steps (plain, penalised, plain, ...: the machine's noise falls
on both alike), in µs:

- step: ``EngineCore.step()``;
- logits: its logits processing (``processed_logits``: planning on the host, the copy and the device ops), the
  whole cost of the options; for plain requests, the one pass that finds nothing to do.

``--vocab-sizes`` other than the built-in model's 512 run a random checkpoint of the built-in shape with that
vocabulary (151,936 is Qwen3's), written once to a temporary folder.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import openinfer.engine_core.sample.sampler as sampler_module
from openinfer.benchmarks.engine_step import start_decoding, use_cycle_drafter
from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.protocol import SamplingParams

PENALTIES: dict[str, Any] = {
    "repetition_penalty": 1.1,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "logit_bias": {5: 2.0, 6: -1.0, 7: 0.5},
    "bad_words_token_ids": [[8], [9, 10]],
}


def build_core(
    model: Path, batch: int, k: int, prompt_len: int, max_tokens: int, penalised: bool
) -> EngineCore:
    """An engine core with ``batch`` requests prefilled and decoding (cycle drafts when k > 0)."""
    blocks = batch * -(-(prompt_len + max_tokens + k + 1) // 16)
    config = EngineConfig(
        model_path=model, served_model_name="bench", num_kv_blocks=blocks, max_num_seqs=batch,
        max_num_batched_tokens=max(batch * prompt_len, batch * (k + 1)),
    )  # fmt: skip
    runner = ModelRunner(model, torch.device("cpu"), blocks, config.block_size, torch.float32)
    core = EngineCore(config, runner)
    vocab = runner.model_config.vocab_size
    use_cycle_drafter(core, k, vocab)
    options = {**PENALTIES, "min_tokens": max_tokens, "stop_token_ids": [4]} if penalised else {}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **options)
    prompts = [[(7 * b + 3 * i + 11) % vocab for i in range(prompt_len)] for b in range(batch)]
    return start_decoding(core, prompts, max_tokens, params)


class LogitsTimer:
    """Nanoseconds inside the engine's ``processed_logits`` during the current step (wrapped where the sampler
    imports it)."""

    def __init__(self) -> None:
        self.current = 0
        self._wrapped: Callable[..., Any] = sampler_module.processed_logits

    def __enter__(self) -> LogitsTimer:
        def timed(*args: Any) -> Any:
            start = time.perf_counter_ns()
            result = self._wrapped(*args)
            self.current += time.perf_counter_ns() - start
            return result

        sampler_module.processed_logits = timed  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        sampler_module.processed_logits = self._wrapped  # type: ignore[assignment]


def timed_steps(core: EngineCore, timer: LogitsTimer, steps: int) -> tuple[list[float], list[float]]:
    """µs per step and µs in the logits processing, for ``steps`` steps."""
    step_us, logits_us = [], []
    for _ in range(steps):
        timer.current = 0
        start = time.perf_counter_ns()
        core.step()
        step_us.append((time.perf_counter_ns() - start) / 1e3)
        logits_us.append(timer.current / 1e3)
    return step_us, logits_us


def measure(model: Path, batch: int, k: int, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """(step, logits) medians for plain and penalised requests, rounds interleaved."""
    max_tokens = args.rounds * args.steps + 8
    samples: dict[str, tuple[list[float], list[float]]] = {"plain": ([], []), "penalised": ([], [])}
    cores = {
        name: build_core(model, batch, k, args.prompt_len, max_tokens, name == "penalised")
        for name in samples
    }
    with LogitsTimer() as timer:
        for _ in range(args.rounds):
            for name, core in cores.items():
                step_us, logits_us = timed_steps(core, timer, args.steps)
                samples[name][0].extend(step_us)
                samples[name][1].extend(logits_us)
    return {name: (statistics.median(s), statistics.median(lg)) for name, (s, lg) in samples.items()}


def model_folder(vocab_size: int, scratch: Path) -> Path:
    builtin = builtin_target_folder()
    if vocab_size == 512:
        return builtin
    return make_tiny_checkpoint(scratch / f"v{vocab_size}", seed=0, overrides={"vocab_size": vocab_size})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--vocab-sizes", type=int, nargs="+", default=[512, 151936])
    parser.add_argument("--num-spec-tokens", type=int, default=4, help="K of the drafts rows")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"cpu, float32, {args.threads} thread(s), {args.prompt_len}-token prompts; µs per step, median of "
          f"{args.rounds} x {args.steps} interleaved steps\n")  # fmt: skip
    print("| vocab | batch | drafts | step, plain | step, penalised | logits, plain | logits, penalised |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for vocab_size in args.vocab_sizes:
            model = model_folder(vocab_size, Path(scratch))
            for batch in args.batch_sizes:
                for k in (0, args.num_spec_tokens):
                    r = measure(model, batch, k, args)
                    label = f"K={k}" if k else "none"
                    print(
                        f"| {vocab_size:,} | {batch} | {label} | {r['plain'][0]:.0f} | {r['penalised'][0]:.0f} "
                        f"| {r['plain'][1]:.0f} | {r['penalised'][1]:.0f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
