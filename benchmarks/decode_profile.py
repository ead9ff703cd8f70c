"""Where a decode step's time goes on the real vocabulary, against the memory floor; not a test.

    python benchmarks/decode_profile.py [--batch-sizes 1 8] [--prompt-len 100] [--steps 30] [--threads 1]
    python benchmarks/decode_profile.py --floor-only --model DIR --prompt-len 1500   # the floor alone

B greedy requests (no penalties, no logprobs, no grammar) of ``real_vocab_checkpoint`` (Qwen3-0.6B's widths
and 151,936-token vocabulary, 2 layers) are prefilled, then decode in one in-process engine core, float32.
Each cell is the median over ``--steps`` steps, in ms, timed by wrapping the engine's own calls on this
instance (nothing is reimplemented):

- step: ``EngineCore.step()``;
- layers: the decoder layers and the final norm; embed: the input embedding; lm head: ``compute_logits``;
- then every call that touches the (B, 151,936) logits, in the sampler's order: grammar (``apply_grammars``),
  plan (``processed_logits``: logits processors), verify (``verify_on_device``: argmax, verification),
  logprobs (``step_logprobs``), read-back (the step's one device-to-host copy);
- host = step - all of the above (scheduling, inputs, booking, outputs).

floor: the bytes a step must read (every weight once, the tied embedding once as the LM head, and each
request's KV cache) over the copy bandwidth measured with a large ``torch`` copy (bytes read + written per
second); step/floor is how far the step is from it. ``--floor-only`` prints the floor of one request of
``--prompt-len`` tokens from the checkpoint's tensor shapes, loading nothing (``vs_vllm.sh`` prints it).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from openinfer.benchmarks.engine_step import start_decoding
from openinfer.benchmarks.real_vocab_checkpoint import real_vocab_checkpoint
from openinfer.engine_core.config import Device, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.weights import checkpoint_files
from openinfer.engine_core.sample import sampler as sampler_module
from openinfer.engine_core.worker import worker as worker_module
from openinfer.engine_core.worker.model_runner import ModelRunner

PARTS = ("layers", "embed", "lm head", "grammar", "plan", "verify", "logprobs", "read-back")
SAMPLER_CALLS = {"grammar": "apply_grammars", "plan": "processed_logits", "verify": "verify_on_device"}
SAMPLER_CALLS["logprobs"] = "step_logprobs"


class PartTimer:
    """Nanoseconds spent in each wrapped call during the current step."""

    def __init__(self) -> None:
        self.current: dict[str, int] = defaultdict(int)

    def wrap(self, part: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            result = call(*args, **kwargs)
            self.current[part] += time.perf_counter_ns() - start
            return result

        return timed


def build_core(model: Path, batch: int, prompt_len: int, steps: int) -> EngineCore:
    """An engine core with ``batch`` greedy requests of ``prompt_len`` tokens, prefilled and decoding."""
    max_tokens = steps + 8
    blocks_per_request = -(-(prompt_len + max_tokens + 1) // 16)
    config = EngineConfig(
        model_path=model,
        served_model_name="bench",
        device=Device.parse("cpu"),
        num_kv_blocks=batch * blocks_per_request,
        max_num_seqs=batch,
        max_num_batched_tokens=max(batch * prompt_len, 2048),
    )
    runner = ModelRunner(
        model, torch.device("cpu"), config.num_kv_blocks or 0, config.block_size, torch.float32
    )
    core = EngineCore(config, runner)
    vocab = runner.model_config.vocab_size
    prompts = [[(7919 * b + 104729 * i + 13) % vocab for i in range(prompt_len)] for b in range(batch)]
    return start_decoding(core, prompts, max_tokens)


@contextmanager
def timed_calls(core: EngineCore, timer: PartTimer) -> Iterator[None]:
    """Wrap the engine's calls of each part on this instance (and the sampler module's, restored after)."""
    runner = core.runner
    assert isinstance(runner, ModelRunner)
    model = runner.model
    for layer in (*model.model.layers, model.model.norm):
        layer.forward = timer.wrap("layers", layer.forward)  # type: ignore[method-assign]
    model.model.embed_tokens.forward = timer.wrap("embed", model.model.embed_tokens.forward)  # type: ignore[method-assign]
    model.compute_logits = timer.wrap("lm head", model.compute_logits)  # type: ignore[method-assign]
    saved = {name: getattr(sampler_module, name) for name in SAMPLER_CALLS.values()}
    read = worker_module.read_back
    try:
        for part, name in SAMPLER_CALLS.items():
            setattr(sampler_module, name, timer.wrap(part, saved[name]))
        worker_module.read_back = timer.wrap("read-back", read)
        yield
    finally:
        for name, call in saved.items():
            setattr(sampler_module, name, call)
        worker_module.read_back = read


def measure(core: EngineCore, steps: int) -> dict[str, float]:
    """Median ms per step of the whole step, each part and the host rest."""
    timer = PartTimer()
    samples: dict[str, list[float]] = defaultdict(list)
    with timed_calls(core, timer):
        for _ in range(steps):
            timer.current.clear()
            start = time.perf_counter_ns()
            core.step()
            total = time.perf_counter_ns() - start
            samples["step"].append(total / 1e6)
            samples["host"].append((total - sum(timer.current.values())) / 1e6)
            for part in PARTS:
                samples[part].append(timer.current.get(part, 0) / 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def copy_bandwidth(num_bytes: int = 512 << 20, repeats: int = 5) -> float:
    """Bytes read + written per second by a large float32 ``torch`` copy (the best of ``repeats``)."""
    src = torch.ones(num_bytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best


def step_bytes(core: EngineCore, batch: int) -> int:
    """Bytes a decode step must read: every parameter once (a tied head is the embedding) and the KV cache
    of each request's context."""
    runner = core.runner
    assert isinstance(runner, ModelRunner)
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    config = runner.model_config
    context = sum(r.num_tokens for r in core.requests.values())
    assert len(core.requests) == batch
    return weights + kv_bytes_per_token(config) * context


def kv_bytes_per_token(config: ModelConfig) -> int:
    """float32 keys and values of one token in every layer."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4


def checkpoint_floor(folder: Path, context: int, bandwidth: float) -> str:
    """The floor of one request's decode step at ``context`` tokens, from the checkpoint's tensor shapes
    (float32; a tied head is stored once), as one line."""
    numel = 0
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            numel += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    num_bytes = 4 * numel + kv_bytes_per_token(ModelConfig.from_folder(folder)) * context
    return (
        f"decode step memory floor at batch 1, {context}-token context: {num_bytes / 1e6:.0f} MB read (float32"
        f" weights + KV cache) / {bandwidth / 1e9:.1f} GB/s copy bandwidth = {num_bytes / bandwidth * 1e3:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="Qwen3 folder (default: real_vocab_checkpoint)"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=100, help="prompt tokens per request")
    parser.add_argument("--steps", type=int, default=30, help="timed decode steps per row")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--floor-only", action="store_true", help="print the floor of one request and exit")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model or real_vocab_checkpoint()
    bandwidth = copy_bandwidth()
    if args.floor_only:
        print(checkpoint_floor(model, args.prompt_len, bandwidth))
        return
    print(f"model {model.name} on cpu, float32, {args.threads} thread(s), {args.prompt_len}-token prompts;")
    print(
        f"ms per decode step, median of {args.steps}; copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write)\n"
    )
    columns = ("step", *PARTS, "host")
    print("| batch | " + " | ".join(columns) + " | floor | step/floor |")
    print("|---:|" + "---:|" * (len(columns) + 2))
    for batch in args.batch_sizes:
        core = build_core(model, batch, args.prompt_len, args.steps)
        result = measure(core, args.steps)
        floor_ms = step_bytes(core, batch) / bandwidth * 1e3
        cells = " | ".join(f"{result[c]:.2f}" for c in columns)
        print(f"| {batch} | {cells} | {floor_ms:.1f} | {result['step'] / floor_ms:.2f}x |", flush=True)
        del core


if __name__ == "__main__":
    main()
