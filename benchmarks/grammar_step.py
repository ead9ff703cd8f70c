"""What structured outputs cost per engine step, on Qwen3's real vocabulary; not a test.

    python benchmarks/grammar_step.py [--batch-sizes 1 8 32] [--num-spec-tokens 4] [--steps 200]

B requests follow one JSON schema (an object with strings, numbers, an enum and an array of objects), each at
its own place in a valid document of it. Each step does what the engine does for them
(``structured_output.apply_grammars`` then ``RequestGrammar.advance``): fill every request's rows of the
bitmask (one row, or K + 1 when it verifies K drafts: the drafts are the document's next tokens, so the
grammar accepts all of them, the dearest case), apply the masks to the (rows, 151,936) float32 logits, and
accept the step's tokens (K + 1 with drafts, all accepted). µs per step, median over ``--steps`` steps:

- fill: the masks on the host (xgrammar's matchers, drafts accepted and rolled back);
- apply: the masks on the logits (xgrammar's CPU kernel here; its CUDA kernel on a GPU);
- advance: the kept tokens accepted into the matchers.

It also times, once, what a request's first step waits for: the compiler for the vocabulary (built once per
engine) and the schema's compilation (once per distinct schema; later requests find it cached).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from openinfer.engine_core.sample.structured_output import (
    GrammarCompilers,
    RequestGrammar,
    allocate_masks,
    apply_masks,
)
from openinfer.engine_core.testing.qwen3_tokenizer import write_qwen3_tokenizer
from openinfer.protocol import StructuredOutputs

VOCAB = 151_936  # Qwen3's embedding rows (the tokenizer has 151,669 tokens)
EOS = 151_645  # <|im_end|>
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["king", "queen", "fool", "ghost"]},
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"act": {"type": "integer"}, "text": {"type": "string"}},
                "required": ["act", "text"],
            },
        },
    },
    "required": ["name", "age", "role", "lines"],
}


def document(num_lines: int) -> str:
    """A long valid instance of SCHEMA."""
    lines = [
        {"act": i % 5 + 1, "text": f"To be, or not to be, that is the question {i}"} for i in range(num_lines)
    ]
    return json.dumps({"name": "Hamlet, Prince of Denmark", "age": 30, "role": "ghost", "lines": lines})


class Cursor:
    """One request's grammar and its place in the document's tokens (restarted near the end)."""

    def __init__(self, compiled: object, tokens: list[int], start: int) -> None:
        self.compiled, self.tokens, self.start = compiled, tokens, start
        self.restart()

    def restart(self) -> None:
        self.grammar = RequestGrammar(self.compiled)  # type: ignore[arg-type]
        assert self.grammar.advance(self.tokens[: self.start])
        self.position = self.start


def measure(
    compiled: object, tokens: list[int], batch: int, k: int, steps: int
) -> tuple[float, float, float]:
    cursors = [Cursor(compiled, tokens, 1 + 37 * b % (len(tokens) // 2)) for b in range(batch)]
    rows_per = k + 1
    logits = torch.zeros(batch * rows_per, VOCAB)
    fill_us, apply_us, advance_us = [], [], []
    for _ in range(steps):
        for cursor in cursors:
            if cursor.position + 2 * rows_per >= len(cursor.tokens):
                cursor.restart()
        start = time.perf_counter_ns()
        masks = allocate_masks(batch * rows_per, VOCAB)
        rows: list[int] = []
        for b, cursor in enumerate(cursors):
            drafts = cursor.tokens[cursor.position : cursor.position + k]
            rows += cursor.grammar.fill(masks, b * rows_per, drafts)
        filled = time.perf_counter_ns()
        apply_masks(logits, masks, rows)
        applied = time.perf_counter_ns()
        for cursor in cursors:
            assert cursor.grammar.advance(cursor.tokens[cursor.position : cursor.position + rows_per])
            cursor.position += rows_per
        advanced = time.perf_counter_ns()
        fill_us.append((filled - start) / 1e3)
        apply_us.append((applied - filled) / 1e3)
        advance_us.append((advanced - applied) / 1e3)
    return statistics.median(fill_us), statistics.median(apply_us), statistics.median(advance_us)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--num-spec-tokens", type=int, default=4, help="K of the drafts rows")
    parser.add_argument("--steps", type=int, default=200, help="steps per row")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer_json = write_qwen3_tokenizer(Path(scratch)) / "tokenizer.json"
        tokens = Tokenizer.from_file(str(tokenizer_json)).encode(document(60)).ids + [EOS]
        compilers = GrammarCompilers(tokenizer_json, VOCAB, [EOS])
        start = time.perf_counter()
        compilers.compile(StructuredOutputs("regex", "a")).result()
        tokenizer_s = time.perf_counter() - start
        start = time.perf_counter()
        compiled = compilers.compile(StructuredOutputs("json", json.dumps(SCHEMA))).result()
        schema_s = time.perf_counter() - start
        start = time.perf_counter()
        compilers.compile(StructuredOutputs("json", json.dumps(SCHEMA))).result()
        cached_s = time.perf_counter() - start
        compilers.shutdown()
    print(f"cpu, {args.threads} thread(s), Qwen3 vocabulary ({VOCAB:,} rows), {len(tokens)}-token document")
    print(f"compiler for the vocabulary (once per engine): {tokenizer_s * 1e3:.0f} ms; the schema: "
          f"{schema_s * 1e3:.1f} ms, {cached_s * 1e3:.2f} ms cached\n")  # fmt: skip
    print("| batch | drafts | fill | apply | advance | total | per request |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for batch in args.batch_sizes:
        for k in (0, args.num_spec_tokens):
            fill, apply, advance = measure(compiled, tokens, batch, k, args.steps)
            total = fill + apply + advance
            label = f"K={k}" if k else "none"
            print(f"| {batch} | {label} | {fill:.0f} | {apply:.0f} | {advance:.0f} | {total:.0f} | "
                  f"{total / batch:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
