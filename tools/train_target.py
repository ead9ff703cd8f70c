"""Train the built-in target model: a 3.3M-parameter Qwen3 (4 layers, hidden 256, the built-in 512-token
tokenizer) on tinyshakespeare. Run once by the project; the output folder is committed as package data.

    python tools/train_target.py [TEXT] [--out-dir engine_core/builtin/target]
        [--work-dir runs/train_target] [--steps 700] [--batch-size 16] [--seq-len 256] [--seed 0] [--threads 1]

TEXT is the training text: by default the tinyshakespeare that ships in `engine_core/builtin/data/`.

The training loop is transformers' `Qwen3ForCausalLM` with the architecture of
`openinfer.engine_core.testing.tiny_model.TINY_QWEN3_CONFIG`, AdamW, warm-up then cosine decay, bfloat16 autocast on
the CPU (float32 master weights). The last tenth of the tokens is held out for validation. Seeded: step s
trains on windows drawn by a generator seeded with (seed, s), so a run resumed from its checkpoint (written
to --work-dir every --checkpoint-every steps, and picked up automatically) is the run that did not stop.

Writes a Hugging Face folder: config.json, model.safetensors (float32), generation_config.json, the
tokenizer files, and README.md (the model card: data, command, steps, losses).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

from openinfer.engine_core.testing.tiny_model import TINY_QWEN3_CONFIG
from openinfer.tools.training import (
    BUILTIN_DIR,
    REPO_ROOT,
    TokenSplit,
    adamw,
    add_dataset_arg,
    add_training_flags,
    builtin_tokenizer,
    command_line,
    copy_tokenizer,
    format_minutes,
    load_split,
    train,
)

SAMPLE_PROMPT = "ROMEO:"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_dataset_arg(parser)
    parser.add_argument("--out-dir", type=Path, default=BUILTIN_DIR / "target", help="the model folder")
    parser.add_argument(
        "--work-dir", type=Path, default=REPO_ROOT / "runs" / "train_target", help="resumable checkpoint"
    )
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    add_training_flags(parser, lr=3e-3, warmup=30, weight_decay=0.1, eval_every=100, checkpoint_every=50)
    return parser.parse_args(argv)


def make_model(seed: int) -> Qwen3ForCausalLM:
    config = Qwen3Config(**TINY_QWEN3_CONFIG, initializer_range=0.02)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def batch(split: TokenSplit, seed: int, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
    """(batch_size, seq_len + 1) training windows for `step`: the same for the same (seed, step)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(split.train) - seq_len - 1, (batch_size,), generator=generator)
    return split.windows(split.train, starts, seq_len + 1)


def lm_loss(model: Qwen3ForCausalLM, windows: torch.Tensor, autocast: bool) -> torch.Tensor:
    """Mean next-token cross-entropy (nats/token) over (B, T + 1) windows."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=windows[:, :-1]).logits  # (B, T, vocab)
    return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())


@torch.no_grad()
def evaluate(
    model: Qwen3ForCausalLM, part: torch.Tensor, seq_len: int, max_windows: int, autocast: bool
) -> float:
    """Mean loss over up to `max_windows` evenly spaced, non-overlapping windows of `part`."""
    model.eval()
    count = min(max_windows, (len(part) - 1) // seq_len)
    stride = (len(part) - 1 - seq_len) // max(1, count - 1)
    starts = torch.arange(count) * stride
    windows = part[starts[:, None] + torch.arange(seq_len + 1)[None, :]]
    losses = [lm_loss(model, chunk, autocast).item() * len(chunk) for chunk in windows.split(32)]
    model.train()
    return sum(losses) / count


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    split = load_split(args.dataset, builtin_tokenizer())
    autocast = not args.no_autocast
    fingerprint = {
        k: getattr(args, k)
        for k in ("steps", "batch_size", "seq_len", "lr", "warmup", "weight_decay", "seed")
    } | {"autocast": autocast, "num_train_tokens": len(split.train)}
    model = make_model(args.seed)
    optimizer = adamw(model, args.lr, args.weight_decay)

    def step_loss(step: int) -> torch.Tensor:
        return lm_loss(model, batch(split, args.seed, step, args.batch_size, args.seq_len), autocast)

    def validate(done: int, loss: float) -> dict[str, float]:
        return {"train_loss": loss, "val_loss": evaluate(model, split.val, args.seq_len, 32, autocast)}

    history, train_seconds = train(model, optimizer, args, fingerprint, step_loss, validate, "target")

    # Final figures in float32 over the whole held-out tail and as many training windows.
    final_val = evaluate(model, split.val, args.seq_len, 10_000, autocast=False)
    final_train = evaluate(model, split.train, args.seq_len, (len(split.val) - 1) // args.seq_len, False)
    print(f"final loss (nats/token): train {final_train:.4f}, validation {final_val:.4f}")
    write_folder(args, model, split, train_seconds, final_train, final_val, history)


def greedy_sample(model: Qwen3ForCausalLM, prompt: str, max_new_tokens: int) -> str:
    tokenizer = builtin_tokenizer()
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    model.eval()
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return tokenizer.decode(out[0].tolist())


def write_folder(
    args: argparse.Namespace,
    model: Qwen3ForCausalLM,
    split: TokenSplit,
    train_seconds: float,
    final_train: float,
    final_val: float,
    history: list[dict[str, float]],
) -> None:
    out = args.out_dir
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    copy_tokenizer(out)
    sample = greedy_sample(model, SAMPLE_PROMPT, 48)
    tokens_seen = args.steps * args.batch_size * args.seq_len
    curve = "\n".join(f"| {h['step']} | {h['train_loss']:.3f} | {h['val_loss']:.3f} |" for h in history)
    card = f"""# openinfer built-in target: tiny Qwen3 trained on tinyshakespeare

A {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M-parameter Qwen3 (4 layers, hidden 256, 4 query / 2 \
key-value heads, head_dim 64, MLP 768, tied embeddings, vocabulary 512: the built-in byte-level BPE \
tokenizer). `openinfer-serve` serves it when no `--model` is given, with the DFlash drafter in `../dflash/`.

- **Data**: `{args.dataset.name}` ({split.num_chars:,} characters, {len(split.train) + len(split.val):,} \
tokens); the first {len(split.train):,} tokens train, the last {len(split.val):,} are held out.
- **Command**: `{command_line()}`
- **Training**: {args.steps} steps of {args.batch_size} x {args.seq_len}-token windows ({tokens_seen:,} \
tokens, {tokens_seen / len(split.train):.1f} epochs), AdamW (peak lr {args.lr}, {args.warmup} warm-up steps, \
cosine to a tenth, weight decay {args.weight_decay}), {"bfloat16 autocast" if not args.no_autocast else "float32"}, \
seed {args.seed}, {args.threads} CPU thread(s): {format_minutes(train_seconds)}.
- **Final loss** (float32, nats/token): training {final_train:.3f}, validation {final_val:.3f}.
- **Acceptance**: see `../dflash/README.md` and `docs/benchmarks.md`.

Greedy continuation of `{SAMPLE_PROMPT}` (48 tokens):

```
{sample}
```

| step | training loss (batch) | validation loss (32 windows) |
|---:|---:|---:|
{curve}
"""
    (out / "README.md").write_text(card)
    summary = {"final_train_loss": final_train, "final_val_loss": final_val, "train_seconds": train_seconds}
    print(json.dumps(summary))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
