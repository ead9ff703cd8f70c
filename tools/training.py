"""What the built-in model's two training scripts share: the tokenized dataset and its split, the one training
loop (AdamW, cosine learning rate, clipping, periodic evaluation, resumable checkpoints) and the model card's
header.

Not part of the serving package: `tools/train_target.py` and `tools/train_dflash.py` import it as a sibling.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from openinfer.engine_core.builtin_model import builtin_text_path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILTIN_DIR = REPO_ROOT / "engine_core" / "builtin"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
VAL_FRACTION = 0.1  # the last tenth of the tokens is held out (nanoGPT's split of tinyshakespeare)


@dataclass(frozen=True)
class TokenSplit:
    """The dataset as token ids, cut once into a training part and a held-out validation tail."""

    train: torch.Tensor  # (num_train_tokens,) int64
    val: torch.Tensor  # (num_val_tokens,) int64
    num_chars: int  # characters in the text file

    def windows(self, part: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
        """(len(starts), length) windows of `part` beginning at `starts`."""
        return part[starts[:, None] + torch.arange(length)[None, :]]


def builtin_tokenizer() -> Tokenizer:
    """The committed byte-level BPE tokenizer (512 tokens), as the engine and the frontend load it."""
    return Tokenizer.from_str((files("openinfer.engine_core") / "builtin" / "tokenizer.json").read_text())


def add_dataset_arg(parser: argparse.ArgumentParser) -> None:
    """The training text, a positional argument that defaults to the tinyshakespeare the package ships."""
    parser.add_argument(
        "dataset",
        type=Path,
        nargs="?",
        default=builtin_text_path(),
        help="the training text (default: the built-in tinyshakespeare, engine_core/builtin/data/; any copy "
        "of char-rnn's input.txt trains the same)",
    )


def load_split(dataset: Path, tokenizer: Tokenizer) -> TokenSplit:
    """Tokenize the whole file and hold out its last VAL_FRACTION of tokens."""
    if not dataset.is_file():
        raise SystemExit(f"{dataset} not found: give a text file, or none for the built-in tinyshakespeare")
    text = dataset.read_text(encoding="utf-8")
    ids = torch.tensor(tokenizer.encode(text).ids, dtype=torch.int64)
    cut = int(len(ids) * (1 - VAL_FRACTION))
    return TokenSplit(train=ids[:cut], val=ids[cut:], num_chars=len(text))


def drafter_arg_parser(
    description: str, folder: str, run: str, work_dir_help: str
) -> argparse.ArgumentParser:
    """The flags a drafter's training script starts with: the training text, the trained target, the drafter
    folder it writes (default: the built-in `folder`) and its run folder (default: runs/`run`)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_dataset_arg(parser)
    parser.add_argument("--target", type=Path, default=BUILTIN_DIR / "target", help="the trained target")
    parser.add_argument("--out-dir", type=Path, default=BUILTIN_DIR / folder, help="the drafter folder")
    parser.add_argument("--work-dir", type=Path, default=REPO_ROOT / "runs" / run, help=work_dir_help)
    return parser


def start_run(args: argparse.Namespace) -> TokenSplit:
    """A training run's first step: torch's CPU threads set to --threads, the training text read, tokenized by
    the built-in tokenizer and split."""
    torch.set_num_threads(args.threads)
    return load_split(args.dataset, builtin_tokenizer())


def copy_tokenizer(folder: Path) -> None:
    """Put the built-in tokenizer files into a model folder (a Hugging Face folder carries its tokenizer)."""
    for name in TOKENIZER_FILES:
        (folder / name).write_bytes((files("openinfer.engine_core") / "builtin" / name).read_bytes())


def add_training_flags(
    parser: argparse.ArgumentParser,
    lr: float,
    warmup: int,
    weight_decay: float,
    eval_every: int,
    checkpoint_every: int,
) -> None:
    """The flags every training script takes, with its own defaults."""
    parser.add_argument("--lr", type=float, default=lr, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--weight-decay", type=float, default=weight_decay)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=eval_every)
    parser.add_argument("--checkpoint-every", type=int, default=checkpoint_every)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--no-autocast",
        action="store_true",
        help="train in float32 (faster on CPUs without bf16 instructions)",
    )


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    torch.save(state, temp)
    os.replace(temp, path)


def load_checkpoint(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint at `path` if it was made with the same settings (`fingerprint`), else None; a
    checkpoint of other settings is refused rather than silently mixed in."""
    if not path.is_file():
        return None
    state: dict[str, Any] = torch.load(path, weights_only=False)
    if state["fingerprint"] != fingerprint:
        raise SystemExit(
            f"{path} was made with other settings ({state['fingerprint']}); remove it or use another "
            "--work-dir"
        )
    return state


def resume(
    path: Path, fingerprint: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[int, float, list[dict[str, Any]]]:
    """Load model and optimizer from the run's checkpoint when there is one: (step, seconds spent, history)."""
    state = load_checkpoint(path, fingerprint)
    if state is None:
        return 0, 0.0, []
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"resuming from {path} at step {state['step']}")
    return state["step"], state["elapsed"], state["history"]


def adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW (betas 0.9, 0.95) with weight decay on the matrices only."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
    )


def train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    args: Any,
    fingerprint: dict[str, Any],
    step_loss: Callable[[int], torch.Tensor],
    evaluate: Callable[[int, float], dict[str, float]],
    desc: str,
) -> tuple[list[dict[str, Any]], float]:
    """The one training loop: steps up to args.steps, each `step_loss(step)` (a scalar, seeded by the step so
    that a resumed run repeats it), backward, gradients clipped to norm 1, AdamW at the cosine learning rate
    (args.lr, args.warmup). Every args.eval_every steps and at the end `evaluate(done, loss)` gives a history
    entry (shown on the progress bar); every args.checkpoint_every steps and at the end the run is saved to
    args.work_dir/checkpoint.pt, from which a run with the same fingerprint resumes.
    Returns (history, seconds spent training, over all resumed runs)."""
    checkpoint_path = args.work_dir / "checkpoint.pt"
    start, elapsed, history = resume(checkpoint_path, fingerprint, model, optimizer)
    params = [p for p in model.parameters() if p.requires_grad]
    began = time.monotonic() - elapsed
    bar = tqdm(total=args.steps, initial=start, desc=desc, unit="step")
    shown = history[-1] if history else {}
    model.train()
    for step in range(start, args.steps):
        lr = cosine_lr(step, args.steps, args.lr, args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = step_loss(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        done = step + 1
        if done % args.eval_every == 0 or done == args.steps:
            shown = {"step": done, **evaluate(done, loss.item())}
            history.append(shown)
            model.train()
        figures = {"loss": loss.item()} | {k: v for k, v in shown.items() if k != "step"}
        bar.set_postfix({k: f"{v:.3f}" for k, v in figures.items()} | {"lr": f"{lr:.1e}"})
        bar.update(1)
        if done % args.checkpoint_every == 0 or done == args.steps:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "history": history}
            elapsed = time.monotonic() - began
            save_checkpoint(
                checkpoint_path, {"fingerprint": fingerprint, "step": done, "elapsed": elapsed, **state}
            )
    bar.close()
    model.eval()
    return history, time.monotonic() - began


def command_line() -> str:
    """How this script was invoked, for the model card: paths inside the repository relative to it, a file
    outside it (the training text) by its name alone, so that the card names nothing a clone lacks."""
    return shlex.join(["python", *(_shown(arg) for arg in sys.argv)])


def _shown(arg: str) -> str:
    path = Path(arg).resolve()
    if not path.exists():
        return arg
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else path.name


def format_minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"
