"""Measuring a drafter in DeepSpec's layout (simulated greedy rounds by output position, the confidence head's
calibration) and its model card.

Part of tools/train_dspark.py; imported as a sibling module."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.tools.dflash_card import Acceptance, walk
from openinfer.tools.dflash_data import PROMPT_LENS, Distillation
from openinfer.tools.dflash_forward import make_blocks
from openinfer.tools.dspark_forward import LossTerms, slot_outputs
from openinfer.tools.training import TokenSplit, command_line, format_minutes

OUTPUT_BUCKETS = (0, 64, 256, 1024)  # rounds are binned by how many tokens the request had generated
ANCHOR_CHUNK = 128  # draft blocks per forward when measuring

# Drafts and their confidences (or None) at anchors (1, A) of sample i: (1, A, K) each.
Proposer = Callable[[int, Tensor], tuple[Tensor, Tensor | None]]


@dataclass
class Measured:
    """Simulated rounds at temperature 0: overall, by output position, and each position's calibration."""

    num_spec_tokens: int
    total: Acceptance
    by_output: list[Acceptance]  # rounds whose anchor lies in OUTPUT_BUCKETS[i] .. OUTPUT_BUCKETS[i + 1]
    reached: list[int] = field(default_factory=list)  # drafts verified with all earlier ones accepted
    accepted: list[int] = field(default_factory=list)  # of those, accepted
    confidence: list[float] = field(default_factory=list)  # of those, the sum of their confidences

    @classmethod
    def empty(cls, k: int) -> Measured:
        def acceptance() -> Acceptance:
            return Acceptance(k, [0] * (k + 1))

        buckets = [acceptance() for _ in OUTPUT_BUCKETS]
        return cls(k, acceptance(), buckets, [0] * k, [0] * k, [0.0] * k)

    def add(self, output_position: int, accepted: int, confidences: list[float] | None) -> None:
        self.total.hist[accepted] += 1
        bucket = max(i for i, start in enumerate(OUTPUT_BUCKETS) if output_position >= start)
        self.by_output[bucket].hist[accepted] += 1
        if confidences is None:
            return
        for i in range(min(accepted + 1, self.num_spec_tokens)):  # drafts 0..accepted were verified reached
            self.reached[i] += 1
            self.accepted[i] += i < accepted
            self.confidence[i] += confidences[i]

    def calibration(self) -> str:
        """Per position: mean confidence / measured conditional acceptance."""
        return " ".join(
            f"{c / max(1, r):.2f}/{a / max(1, r):.2f}"
            for c, a, r in zip(self.confidence, self.accepted, self.reached, strict=True)
        )


@torch.no_grad()
def measure(data: Distillation, k: int, propose: Proposer, samples: int | None = None) -> Measured:
    """Walk the engine's greedy rounds (`dflash_card.walk`) over `data`'s first `samples` sequences with the
    drafts `propose` makes at every generated position."""
    measured = Measured.empty(k)
    for i in range(len(data.tokens) if samples is None else min(samples, len(data.tokens))):
        prompt_len = int(data.prompt_lens[i])
        drafts: dict[int, list[int]] = {}
        confidences: dict[int, list[float]] = {}
        for anchors in torch.arange(prompt_len, data.seq_len - k).split(ANCHOR_CHUNK):
            ids, conf = propose(i, anchors[None, :])
            drafts.update(zip(anchors.tolist(), ids[0].tolist(), strict=True))
            if conf is not None:
                confidences.update(zip(anchors.tolist(), conf[0].tolist(), strict=True))
        for p, accepted in walk(data.tokens[i].tolist(), prompt_len, k, drafts):
            measured.add(p - prompt_len, accepted, confidences.get(p))
    return measured


def deepspec_proposer(
    model: DFlashDraftModel, target: Qwen3ForCausalLM, data: Distillation, args: argparse.Namespace
) -> Proposer:
    """Greedy drafts of a drafter in DeepSpec's layout (Markov bias from its own drafts) and its confidences."""

    def propose(i: int, anchors: Tensor) -> tuple[Tensor, Tensor | None]:
        k = args.block_size
        blocks = make_blocks(data.tokens[i : i + 1], anchors, args.block_size, k, args.mask_token_id)
        outputs = slot_outputs(model, target, data.features[i : i + 1], blocks, k, teacher_forced=False)
        conf = outputs.confidence_logits
        return outputs.logits.argmax(-1), None if conf is None else torch.sigmoid(conf)

    return propose


def ngram_measured(data: Distillation, k: int, samples: int | None = None) -> Measured:
    """vLLM's n-gram lookup (n in [1, 4]) on the same sequences, binned the same way."""
    measured = Measured.empty(k)
    for i in range(len(data.tokens) if samples is None else min(samples, len(data.tokens))):
        prompt_len = int(data.prompt_lens[i])
        for p, accepted in walk(data.tokens[i].tolist(), prompt_len, k, None):
            measured.add(p - prompt_len, accepted, None)
    return measured


def row(name: str, acc: Acceptance) -> str:
    rates = " ".join(f"{r:.3f}" for r in acc.per_position())
    hist = " / ".join(map(str, acc.hist))
    zero, full = 100 * acc.hist[0] / max(1, acc.rounds), 100 * acc.hist[-1] / max(1, acc.rounds)
    return (
        f"| {name} | {acc.rounds} | {acc.mean_accepted:.3f} | {zero:.1f}% | {full:.1f}% | {hist} | {rates} |"
    )


def by_output_row(name: str, measured: Measured) -> str:
    return (
        f"| {name} | " + " | ".join(f"{b.mean_accepted:.2f} ({b.rounds})" for b in measured.by_output) + " |"
    )


def describe_drafter(args: argparse.Namespace) -> str:
    if args.markov_rank == 0:
        return "DeepSpec's DFlash (`markov_rank: 0`, no confidence head)"
    confidence = "a confidence head reading [h_k; e_k]" if args.confidence_head else "no confidence head"
    return f"DSpark: a `{args.markov_head_type}` Markov head of rank {args.markov_rank} and {confidence}"


def write_card(
    args: argparse.Namespace,
    split: TokenSplit,
    data_seconds: float,
    train_seconds: float,
    val_terms: LossTerms,
    rows: dict[str, Measured],
    history: list[dict[str, float]],
    compared: int,
) -> None:
    k = args.block_size
    config = DFlashConfig.from_folder(args.out_dir)
    num_params = sum(p.numel() for p in DFlashDraftModel(config).parameters())
    curve = "\n".join(f"| {h['step']} | {h['loss']:.3f} | {h['val_mean_accepted']:.3f} |" for h in history)
    buckets = [
        f"{a}-{b}" for a, b in zip(OUTPUT_BUCKETS, (*OUTPUT_BUCKETS[1:], args.val_seq_len), strict=True)
    ]
    mine = next(iter(rows.values()))
    bce = "" if val_terms.bce is None else f", BCE {val_terms.bce.item():.3f}"
    started = ""
    if args.init_from is not None:  # the earlier drafter's own data and training are in git history's card
        started = (
            f"\n- **Started from**: the weights of the drafter then at `{args.init_from.name}` (fine-tuned)"
        )
    weights = f"{args.ce_weight} CE + {args.l1_weight} L1" + (
        f" + {args.bce_weight} BCE" if args.confidence_head else ""
    )
    calibration = (
        f"\nConfidence calibration on the same rounds, per position, mean confidence / measured conditional "
        f"acceptance of the drafts verified with all earlier ones accepted: {mine.calibration()}.\n"
        if args.confidence_head
        else ""
    )
    card = f"""# openinfer built-in {args.title}

A {num_params / 1e6:.2f}M-parameter block drafter in DeepSeek's DeepSpec checkpoint layout \
(`Qwen3DSparkModel`), {describe_drafter(args)}, distilled from the built-in target (`../target/`): \
{args.num_layers} draft layers of the target's sizes, context features from target layers \
{args.target_layer_ids}, block size {k} (the current token then {k - 1} mask tokens, mask token id \
{args.mask_token_id}, the NUL byte, which never occurs in text); every slot drafts (slot k drafts the token \
after position p + k), so a round verifies {k} drafts: `--draft-model` given alone serves it as \
`--spec-method {args.method} --num-spec-tokens {k}`. It carries copies of the target's embedding and LM head, \
as DeepSpec's checkpoints do.

- **Data**: {args.num_sequences} sequences of {args.seq_len} tokens: prompts of \
{", ".join(map(str, PROMPT_LENS))} tokens cut from the training part of `{args.dataset.name}` (the first 90 % \
of its tokens), continued greedily by the target (its own temperature-0 text); {args.num_val_sequences} \
held-out sequences of {args.val_seq_len} tokens from the last 10 %: {format_minutes(data_seconds)} to generate \
(or load from --data-dir) and featurize.
- **Command**: `{command_line()}`{started}
- **Training**: {args.steps} steps of {args.batch_size} sequences x {args.anchors} draft blocks at random \
generated positions; DeepSpec's loss: {weights} (CE against the target's greedy tokens, L1 between the draft's \
and the target's distributions, BCE of the confidence against the acceptance label `{args.acceptance}`), the \
Markov head teacher-forced, slot k weighted by exp(-k/{args.loss_decay}); AdamW (peak lr {args.lr}, \
{args.warmup} warm-up steps, cosine to a tenth), {"bfloat16 autocast" if not args.no_autocast else "float32"}, \
seed {args.seed}, {args.threads} CPU thread(s): {format_minutes(train_seconds)}.
- **Held-out loss terms** (float32, slot-weighted): CE {val_terms.ce.item():.3f}, L1 {val_terms.l1.item():.3f}\
{bce}.
- **Checked**: loaded by the engine, it proposes what the training forward does on {compared} held-out blocks.

Acceptance at temperature 0, simulated on the {args.num_val_sequences} held-out sequences, K = {k}, each round \
as the engine runs it (the served figures, from `openinfer-bench`, are in `docs/benchmarks.md`):

| drafter | rounds | mean accepted draft | zero-accept | full-{k} | histogram 0..{k} | per-position rates |
|---|---:|---:|---:|---:|---|---|
{chr(10).join(row(name, m.total) for name, m in rows.items())}

Mean accepted draft (rounds) by the output position of the round:

| drafter | {" | ".join(buckets)} |
|---|{"---:|" * len(buckets)}
{chr(10).join(by_output_row(name, m) for name, m in rows.items())}
{calibration}
| step | training loss (batch) | held-out mean accepted |
|---:|---:|---:|
{curve}
"""
    (args.out_dir / "README.md").write_text(card)
    print(
        json.dumps(
            {name: m.total.mean_accepted for name, m in rows.items()} | {"train_seconds": train_seconds}
        )
    )
