"""Fit a DSpark drafter's sampled confidence head: the second head the engine reads for the requests it drafts
for at temperature > 0 (engine_core/models/dspark_heads.py). Run once by the project on the built-in drafter;
the files it adds to the drafter folder are committed as package data.

    python tools/train_sampled_confidence.py [TEXT] [--drafter engine_core/builtin/dspark_block7] [--temperature 0.8]

A DSpark drafter's own head is fitted to greedy acceptance (does the draft's argmax equal the target's?). A
draft drawn at temperature T is accepted by rejection sampling with probability 1 - TV(q_T, p_T), q_T and p_T
the drafter's and the target's distributions at T (DeepSpec's `sampled` label, which it takes at T = 1). Served
at T = 0.8 the built-in drafter's greedy head overestimated that by 0.1-0.2 (docs/benchmarks.md).

1. Data: prompts cut from the training part of TEXT, continued by the target at --temperature (what a sampled
   request's context looks like), with the target's layer outputs and final hidden states
   (tools/dflash_data.py; cached in --data-dir).
2. Labels: at --anchors random blocks of each sequence, every slot's 1 - TV at --temperature, the Markov head
   teacher-forced by the sampled text (as DeepSpec trains its head), beside what the head reads there.
3. Fit: the drafter frozen; a head of the greedy head's shape, started from it, fitted by BCE against the labels
   (a logistic regression on soft labels: full-batch L-BFGS).
4. Check: on held-out sequences, per slot, both heads' mean confidence against the mean label.

Writes sampled_confidence.safetensors, `sampled_confidence_temperature` in config.json, and a section of the
folder's README.md.
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.dspark_heads import ConfidenceHead
from openinfer.engine_core.testing.dspark_checkpoint import write_sampled_confidence
from openinfer.tools.dflash_data import DataSpec, Distillation, distillation_data, load_target
from openinfer.tools.dflash_forward import make_blocks, sample_anchors
from openinfer.tools.dspark_forward import slot_outputs, target_logits
from openinfer.tools.training import BUILTIN_DIR, REPO_ROOT, add_dataset_arg, format_minutes, start_run

CARD_HEADING = "## The sampled confidence head"


@dataclass(frozen=True)
class Examples:
    """Draft slots at random blocks: what the confidence head reads there, and the label."""

    features: Tensor  # (N, K, in_features) float32
    labels: Tensor  # (N, K) float32 in [0, 1]: the chance a draft drawn at T is accepted


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_dataset_arg(parser)
    parser.add_argument("--target", type=Path, default=BUILTIN_DIR / "target", help="the trained target")
    parser.add_argument("--drafter", type=Path, default=BUILTIN_DIR / "dspark_block7", help="a DSpark folder")
    parser.add_argument("--temperature", type=float, default=0.8, help="the T drafts are drawn at")
    parser.add_argument(
        "--data-dir", type=Path, default=REPO_ROOT / "runs" / "distill_data", help="sequences, shared"
    )
    parser.add_argument("--num-sequences", type=int, default=256, help="sequences to fit on")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    parser.add_argument("--num-val-sequences", type=int, default=32, help="held-out sequences")
    parser.add_argument("--val-seq-len", type=int, default=2048, help="tokens per held-out sequence")
    parser.add_argument("--gen-batch", type=int, default=64, help="sequences generated at once")
    parser.add_argument("--anchors", type=int, default=48, help="draft blocks per sequence")
    parser.add_argument("--iterations", type=int, default=200, help="L-BFGS iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args(argv)
    if not 0 < args.temperature < 10:
        parser.error(f"--temperature must be in (0, 10), got {args.temperature}")
    return args


@torch.no_grad()
def examples(
    model: DFlashDraftModel, target: Qwen3ForCausalLM, data: Distillation, args: argparse.Namespace, seed: int
) -> Examples:
    """--anchors blocks of every sequence of `data` (anchors drawn from a generator seeded with `seed`)."""
    k, generator = model.config.block_size, torch.Generator().manual_seed(seed)
    parts = []
    for rows in torch.arange(len(data.tokens)).split(8):
        anchors = sample_anchors(data.prompt_lens[rows], args.anchors, k, data.seq_len, generator)
        parts.append(block_examples(model, target, data, rows, anchors, args.temperature))
    return Examples(torch.cat([p.features for p in parts]), torch.cat([p.labels for p in parts]))


def block_examples(
    model: DFlashDraftModel,
    target: Qwen3ForCausalLM,
    data: Distillation,
    rows: Tensor,
    anchors: Tensor,
    temperature: float,
) -> Examples:
    """The blocks at `anchors` (B, A) of sequences `rows` (B,): each slot's head features and its label, the
    acceptance chance of a draft drawn at `temperature`, sum_x min(q_T(x), p_T(x)) = 1 - TV(q_T, p_T)."""
    assert data.final is not None
    config, k = model.config, model.config.block_size
    blocks = make_blocks(data.tokens[rows], anchors, config.block_size, k, config.mask_token_id)
    outputs = slot_outputs(model, target, data.features[rows], blocks, k, teacher_forced=True)
    assert outputs.head_features is not None
    teacher = target_logits(target, data.final[rows], anchors, k)  # (B, A, K, vocab)
    draft_t, target_t = outputs.logits.div(temperature).softmax(-1), teacher.div(temperature).softmax(-1)
    labels = (1.0 - 0.5 * (draft_t - target_t).abs().sum(-1)).clamp(0.0, 1.0)  # (B, A, K)
    return Examples(outputs.head_features.float().flatten(0, 1), labels.flatten(0, 1))


def fit(start: ConfidenceHead, train: Examples, iterations: int) -> ConfidenceHead:
    """A copy of `start` fitted by BCE against `train`'s soft labels (every slot alike)."""
    head = copy.deepcopy(start)
    features, labels = train.features.flatten(0, 1), train.labels.flatten()
    optimizer = torch.optim.LBFGS(head.parameters(), max_iter=iterations, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(head.proj(features).squeeze(-1), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    return head


@torch.no_grad()
def calibration(head: ConfidenceHead, held_out: Examples) -> tuple[list[float], float | None]:
    """Per slot, the head's mean confidence on `held_out`; and its BCE against the labels."""
    logits = head.proj(held_out.features).squeeze(-1)  # (N, K)
    bce = F.binary_cross_entropy_with_logits(logits, held_out.labels).item()
    return logits.sigmoid().mean(0).tolist(), bce


def card(args: argparse.Namespace, rows: dict[str, tuple[list[float], float | None]], minutes: str) -> str:
    """The README section: how the head was made and its held-out calibration."""

    def cells(values: list[float]) -> str:
        return " | ".join(f"{v:.3f}" for v in values)

    k = len(next(iter(rows.values()))[0])
    lines = [
        CARD_HEADING,
        "",
        f"`sampled_confidence.safetensors` holds a second confidence head, read for requests drafted at "
        f"temperature > 0 (`sampled_confidence_temperature`: {args.temperature:g} in config.json). It was fitted, "
        "the drafter frozen and starting from the greedy head, to the chance that a draft drawn at "
        f"T = {args.temperature:g} is accepted by rejection sampling, 1 - TV(drafter, target) at that T "
        f"(DeepSpec's `sampled` label), on {args.num_sequences} sequences of {args.seq_len} tokens that the "
        f"target continued at T = {args.temperature:g} from prompts of the training text, {args.anchors} "
        f"blocks each, the Markov head teacher-forced; {args.iterations} L-BFGS iterations on BCE ({minutes} "
        "in all).",
        "",
        f"- **Command**: `python tools/train_sampled_confidence.py --temperature {args.temperature:g}`",
        "",
        f"Held out ({args.num_val_sequences} sequences of {args.val_seq_len} tokens continued at "
        f"T = {args.temperature:g}, {args.anchors} blocks each): per slot, the mean confidence against the "
        "mean label (the acceptance a drawn draft has when the drafts before it were accepted).",
        "",
        "| | BCE | " + " | ".join(f"slot {i}" for i in range(k)) + " |",
        "|---|---:|" + "---:|" * k,
    ]
    lines += [f"| {name} | {_bce(bce)} | {cells(values)} |" for name, (values, bce) in rows.items()]
    return "\n".join(lines) + "\n"


def _bce(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def write_card_section(folder: Path, section: str) -> None:
    """Replace (or append) the README's section under CARD_HEADING."""
    readme = folder / "README.md"
    text = readme.read_text()
    kept = text.split(CARD_HEADING)[0].rstrip("\n")
    readme.write_text(kept + "\n\n" + section)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    began = time.monotonic()
    split = start_run(args)
    target = load_target(args.target)
    config = DFlashConfig.from_folder(args.drafter)
    model = DFlashDraftModel(config).eval()
    model.load_weights(args.drafter)
    greedy = model.confidence_head
    if greedy is None or config.heads is None:
        raise SystemExit(f"{args.drafter} has no confidence head: it is not a DSpark drafter")
    layers = list(config.target_layer_ids)
    t = args.temperature
    specs = (
        DataSpec("train", args.num_sequences, args.seq_len, args.seed, args.gen_batch, t),
        DataSpec("val", args.num_val_sequences, args.val_seq_len, args.seed + 1, args.gen_batch, t),
    )
    train_data, val_data = (
        distillation_data(target, args.target, part, spec, args.data_dir, layers, True)
        for part, spec in zip((split.train, split.val), specs, strict=True)
    )
    train = examples(model, target, train_data, args, args.seed)
    held_out = examples(model, target, val_data, args, args.seed + 12345)
    head = fit(greedy, train, args.iterations)
    label = held_out.labels.mean(0).tolist()
    rows = {
        "label (1 - TV)": (label, None),
        "the greedy head": calibration(greedy, held_out),
        "the sampled head": calibration(head, held_out),
    }
    for name, (values, bce) in rows.items():
        print(f"{name:>18}: BCE {_bce(bce)}  " + " ".join(f"{v:.3f}" for v in values))
    write_sampled_confidence(args.drafter, t, head.proj.weight, head.proj.bias)
    write_card_section(args.drafter, card(args, rows, format_minutes(time.monotonic() - began)))
    print(f"wrote the sampled head into {args.drafter} in {format_minutes(time.monotonic() - began)}")


if __name__ == "__main__":
    main()
