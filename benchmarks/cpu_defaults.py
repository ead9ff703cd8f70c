"""The measurements behind the CPU defaults (threads, prefill chunk size, dtype); not a test.

    python benchmarks/cpu_defaults.py        # the built-in model and a 2-layer Qwen3-0.6B-shaped checkpoint

Prints three markdown tables: (1) a 1,500-token prompt prefilled in chunks of each `--chunks` size (one
`ModelRunner.execute` per chunk, logits for the last token only, as the engine's chunked prefill runs it),
total milliseconds per model, dtype and thread count; (2) one decode step of that prompt, the same columns;
(3) what the CPU offers (`torch.backends.cpu.get_cpu_capability()`) and a (1024 x 1024) @ (1024 x 3072)
matmul's time in float32 and bfloat16. The 0.6B-shaped checkpoint (the real 151,936-token vocabulary,
hidden 1024, 16/8 heads of 128, MLP 3072, 2 layers) is written with random weights into a temporary folder.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from openinfer.benchmarks.model_step import median_ms
from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.testing.qwen3_checkpoint import make_qwen3_0_6b_shaped_checkpoint
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.worker.model_runner import ModelRunner

BLOCK_SIZE = 16
PROMPT_LEN = 1500
DTYPES = (torch.float32, torch.bfloat16)


def prefill(runner: ModelRunner, chunk: int) -> Callable[[], object]:
    """The PROMPT_LEN-token prompt in chunks of `chunk` tokens, one execute each."""
    vocab = runner.model_config.vocab_size
    prompt = [(7 * i + 3) % vocab for i in range(PROMPT_LEN)]
    table = list(range(-(-(PROMPT_LEN + 1) // BLOCK_SIZE)))
    steps = [
        chunk_step([SeqChunk(prompt[s : s + chunk], s, table)], runner) for s in range(0, PROMPT_LEN, chunk)
    ]
    return lambda: [runner.execute(step) for step in steps]


def decode(runner: ModelRunner) -> Callable[[], object]:
    """One token after the PROMPT_LEN-token prompt (the prompt's keys already cached by `prefill`)."""
    table = list(range(-(-(PROMPT_LEN + 1) // BLOCK_SIZE)))
    step = chunk_step([SeqChunk([11], PROMPT_LEN, table)], runner)
    return lambda: runner.execute(step)


def matmul_ms(dtype: torch.dtype) -> float:
    a, b = torch.randn(1024, 1024).to(dtype), torch.randn(1024, 3072).to(dtype)
    return median_ms(lambda: a @ b, 1, 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    num_blocks = -(-(PROMPT_LEN + 1) // BLOCK_SIZE)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        models = {
            "built-in": builtin_target_folder(),
            "0.6B-shaped, 2 layers": make_qwen3_0_6b_shaped_checkpoint(Path(tmp) / "qwen3"),
        }
        prefill_rows, decode_rows = [], []
        for name, folder in models.items():
            for dtype in DTYPES:
                runner = ModelRunner(folder, torch.device("cpu"), num_blocks, BLOCK_SIZE, dtype)
                for threads in args.threads:
                    torch.set_num_threads(threads)
                    cells = [median_ms(prefill(runner, c), 1, args.repeats) for c in args.chunks]
                    label = f"| {name} | {str(dtype).removeprefix('torch.')} | {threads} |"
                    prefill_rows.append(label + "".join(f" {ms:.0f} |" for ms in cells))
                    decode_rows.append(label + f" {median_ms(decode(runner), 1, 10 * args.repeats):.2f} |")
                    print(prefill_rows[-1], decode_rows[-1], flush=True)
    head = "| model | dtype | threads |"
    print(f"\nprefill of {PROMPT_LEN} tokens, total ms by chunk size\n")
    print(head + "".join(f" chunk {c} |" for c in args.chunks))
    print("|---|---|---:|" + "---:|" * len(args.chunks))
    print("\n".join(prefill_rows))
    print(f"\none decode step after {PROMPT_LEN} tokens, ms\n")
    print(head + " decode |\n|---|---|---:|---:|")
    print("\n".join(decode_rows))
    torch.set_num_threads(1)
    print(f"\nCPU capability {torch.backends.cpu.get_cpu_capability()}; (1024x1024)@(1024x3072), 1 thread:")
    print("".join(f" {str(d).removeprefix('torch.')} {matmul_ms(d):.2f} ms;" for d in DTYPES))


if __name__ == "__main__":
    main()
