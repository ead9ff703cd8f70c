"""The engine's host overhead: time per `EngineCore.step` outside the model forward; not a test.

    python benchmarks/engine_step.py [--batch-sizes 1 8 64] [--num-spec-tokens 4] [--steps 100] [--profile]

B requests of the built-in model (greedy, 32-token prompts, prefilled first) decode in one engine core, in
this process. "no drafts" rows decode one token per request per step; "K drafts" rows verify K draft tokens
per request every step, proposed by a cycle drafter that costs nothing itself (its drafts are mostly
rejected, so every step takes the full verify path). Each cell is the median over ``--steps`` steps, in µs:

- step: ``EngineCore.step()`` plus encoding its outputs for the frontend (what the engine loop does per step);
- model: the target's forward and LM head (on CUDA, synchronised at both ends);
- host = step - model, and its parts: schedule, prepare (the step's inputs, from the input batch's arrays to
  the runner's tensors: the worker's execute call but the model, the sampler, the drafter's device part and
  the read-back), update (the sampler: grammar masks, logits processors, verification, logprobs; the
  drafter's context; the step's one read-back; then the scheduler's booking: appending, stop checks, KV
  commits; counters, outputs), propose (the drafter call), encode.

The parts are timed by wrapping the engine core's own methods on this instance. ``--profile`` prints
cProfile's top functions (by own time) over the host path at the largest batch with drafts.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.config import Device, DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.spec_decode.drafter import ContextRows, DraftQuery
from openinfer.engine_core.worker import worker as worker_module
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.protocol import EngineCoreOutputs, EngineCoreRequest, EngineOutputCodec, SamplingParams

PROMPT_LEN = 32
PARTS = ("schedule", "prepare", "model", "update", "propose", "encode")


class CycleDrafter:
    """Proposes ``max_drafts`` tokens continuing a fixed cycle after the current token, at no cost."""

    aux_layer_ids: tuple[int, ...] = ()
    estimates_confidence = False

    def __init__(self, num_spec_tokens: int, vocab_size: int) -> None:
        self.num_spec_tokens = num_spec_tokens
        self._vocab_size = vocab_size

    def extend_context(self, rows: ContextRows) -> None:
        pass

    def propose(self, queries: list[DraftQuery]) -> list[list[int]]:
        return [[(q.current_token + 1 + i) % self._vocab_size for i in range(q.max_drafts)] for q in queries]

    def describe(self) -> str:
        return f"cycle K={self.num_spec_tokens}"


class PartTimer:
    """Nanoseconds spent in each wrapped call during the current step."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.current: dict[str, int] = defaultdict(int)
        self._sync = sync

    def wrap(self, part: str, call: Callable[..., Any], synced: bool = False) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if synced:
                self._sync()
            start = time.perf_counter_ns()
            result = call(*args, **kwargs)
            if synced:
                self._sync()
            self.current[part] += time.perf_counter_ns() - start
            return result

        return timed


def build_core(batch: int, num_spec_tokens: int, device: torch.device, model: Path, steps: int) -> EngineCore:
    """An engine core with ``batch`` requests prefilled and decoding (drafts from the cycle drafter if K > 0)."""
    max_tokens = steps + 40
    blocks_per_request = -(-(PROMPT_LEN + max_tokens + num_spec_tokens + 1) // 16)
    config = EngineConfig(
        model_path=model,
        served_model_name="bench",
        device=Device.parse(str(device)),
        num_kv_blocks=batch * blocks_per_request,
        max_num_seqs=batch,
        max_num_batched_tokens=max(batch * PROMPT_LEN, batch * (num_spec_tokens + 1)),
    )
    runner = ModelRunner(model, device, config.num_kv_blocks or 0, config.block_size, torch.float32)
    core = EngineCore(config, runner)
    vocab = runner.model_config.vocab_size
    use_cycle_drafter(core, num_spec_tokens, vocab)
    prompts = [[(7 * b + 3 * i + 1) % vocab for i in range(PROMPT_LEN)] for b in range(batch)]
    return start_decoding(core, prompts, max_tokens)


def use_cycle_drafter(core: EngineCore, num_spec_tokens: int, vocab_size: int) -> None:
    """When K = ``num_spec_tokens`` > 0, K cycle drafts per request per step: the n-gram drafter's spec-decode
    state with a ``CycleDrafter`` in its place."""
    if num_spec_tokens:
        core.load_drafter(DrafterSpec("ngram", num_spec_tokens))
        assert core.spec is not None
        core.spec.drafter = CycleDrafter(num_spec_tokens, vocab_size)


def start_decoding(
    core: EngineCore, prompts: list[list[int]], max_tokens: int, params: SamplingParams | None = None
) -> EngineCore:
    """Add one request per prompt (``params``, by default greedy with EOS ignored) and step until every one has
    decoded twice: prefill behind it, the steps timed next are decodes."""
    params = params or SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for b, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(f"r{b}", prompt, params))
    while any(r.num_output_tokens < 2 for r in core.requests.values()):
        core.step()
    return core


def measure(core: EngineCore, steps: int, device: torch.device) -> dict[str, float]:
    """Median µs per step of the whole step, the model, host = step - model, and each part."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timer = PartTimer(sync)
    runner = core.runner
    assert isinstance(runner, ModelRunner)
    core.scheduler.schedule = timer.wrap("schedule", core.scheduler.schedule)  # type: ignore[method-assign]
    core.worker.execute = timer.wrap("execute", core.worker.execute)  # type: ignore[method-assign]
    core.worker.sampler = timer.wrap("sample", core.worker.sampler)  # type: ignore[assignment]
    read = worker_module.read_back  # the step's read-back, inside the worker's execute (restored below)
    worker_module.read_back = timer.wrap("sample", read)
    runner.model.forward = timer.wrap("model", runner.model.forward, synced=True)  # type: ignore[method-assign]
    runner.model.compute_logits = timer.wrap("model", runner.model.compute_logits, synced=True)  # type: ignore[method-assign]
    replay = torch.cuda.CUDAGraph.replay  # graph replays are the model's forward too (restored below)
    if runner.step_graphs is not None:
        torch.cuda.CUDAGraph.replay = timer.wrap("model", replay, synced=True)  # type: ignore[method-assign]
    scheduler = core.scheduler
    scheduler.update_from_output = timer.wrap("update", scheduler.update_from_output)  # type: ignore[method-assign]
    core._outputs = timer.wrap("update", core._outputs)  # type: ignore[method-assign]
    if core.spec is not None:
        core.spec.after_step = timer.wrap("update", core.spec.after_step)  # type: ignore[method-assign]
        core.spec.draft_on_device = timer.wrap("sample", core.spec.draft_on_device)  # type: ignore[method-assign]
        core.spec.propose = timer.wrap("propose", core.spec.propose)  # type: ignore[method-assign]
    try:
        samples = timed_steps(core, timer, steps)
    finally:
        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]
        worker_module.read_back = read
    return {name: statistics.median(values) for name, values in samples.items()}


def timed_steps(core: EngineCore, timer: PartTimer, steps: int) -> dict[str, list[float]]:
    """µs of each step, its host part and each wrapped part, for ``steps`` steps."""
    codec = EngineOutputCodec()
    samples: dict[str, list[float]] = defaultdict(list)
    for seq in range(steps):
        timer.current.clear()
        start = time.perf_counter_ns()
        outputs = core.step()
        encode_start = time.perf_counter_ns()
        codec.encode(EngineCoreOutputs(0, 0, seq, time.time(), outputs, core.load_snapshot()))
        end = time.perf_counter_ns()
        timer.current["encode"] = end - encode_start
        parts = dict(timer.current)
        # The sampler, the drafter's device part and the read-back run inside the worker's execute; they are
        # counted with the update, as the sampler and the drafter's context were before.
        sample = parts.pop("sample", 0)
        parts["prepare"] = parts.pop("execute", 0) - parts.get("model", 0) - sample
        parts["update"] = parts.get("update", 0) + sample
        samples["step"].append((end - start) / 1e3)
        samples["host"].append((end - start - parts.get("model", 0)) / 1e3)
        for part in PARTS:
            samples[part].append(parts.get(part, 0) / 1e3)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None, help="Qwen3 folder (default: the built-in model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--num-spec-tokens", type=int, default=4, help="K of the drafts rows")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per row")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--profile", action="store_true", help="cProfile the host path at the largest batch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = args.model or builtin_target_folder()

    columns = ("step", "model", "host", *(p for p in PARTS if p != "model"))
    print(
        f"model {model.name} on {device}, float32, {args.threads} thread(s); µs per step, median of {args.steps}\n"
    )
    print("| batch | drafts | " + " | ".join(columns) + " |")
    print("|---:|---|" + "---:|" * len(columns))
    for batch in args.batch_sizes:
        for k in (0, args.num_spec_tokens):
            result = measure(build_core(batch, k, device, model, args.steps), args.steps, device)
            label = f"K={k}" if k else "none"
            print(
                f"| {batch} | {label} | " + " | ".join(f"{result[c]:.0f}" for c in columns) + " |", flush=True
            )

    if args.profile:
        core = build_core(max(args.batch_sizes), args.num_spec_tokens, device, model, args.steps)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            core.step()
        profiler.disable()
        print()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
