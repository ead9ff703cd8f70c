"""Measuring a trained drafter (simulated greedy rounds, the engine's own proposals) and its model card.

Part of tools/train_dflash.py; imported as a sibling module, like training.py."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.drafter import ContextUpdate, DraftQuery, context_rows
from openinfer.engine_core.spec_decode.ngram import ngram_propose
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.verification import accepted_prefix_length
from openinfer.tools.dflash_data import (
    PROMPT_LENS,
    Distillation,
)
from openinfer.tools.dflash_forward import (
    Blocks,
    draft_logits,
    make_blocks,
)
from openinfer.tools.training import (
    TokenSplit,
    command_line,
    format_minutes,
)

LAYOUTS = {  # for the model card
    AnchorLayout.MASK_SLOTS: (
        "z-lab's `mask_slots` layout (`sample_from_anchor: false`): slot i >= 1 drafts position p+i"
    ),
    AnchorLayout.ANCHOR_SLOT: (
        "the `anchor_slot` layout (`sample_from_anchor: true`, DSpark's; openinfer reads it, vLLM's DFlash path "
        "refuses it): slot i drafts position p+i+1, so the current token's own slot drafts the next token"
    ),
}


@dataclass
class Acceptance:
    """Rounds of greedy verification: how many of K drafts each accepted."""

    num_spec_tokens: int
    hist: list[int]  # hist[n]: rounds with n accepted

    @property
    def rounds(self) -> int:
        return sum(self.hist)

    @property
    def mean_accepted(self) -> float:
        return sum(n * c for n, c in enumerate(self.hist)) / max(1, self.rounds)

    def per_position(self) -> list[float]:
        return [sum(self.hist[i + 1 :]) / max(1, self.rounds) for i in range(self.num_spec_tokens)]

    def describe(self) -> str:
        rates = " ".join(f"{r:.3f}" for r in self.per_position())
        return (
            f"{self.rounds} rounds, mean accepted {self.mean_accepted:.3f}, zero-accept "
            f"{100 * self.hist[0] / max(1, self.rounds):.1f}%, full {100 * self.hist[-1] / max(1, self.rounds):.1f}%, "
            f"histogram {' / '.join(map(str, self.hist))}, per position {rates}"
        )


def walk(
    tokens: list[int], prompt_len: int, k: int, propose: dict[int, list[int]] | None
) -> list[tuple[int, int]]:
    """(p, accepted) of each round the engine runs on one greedy sequence: the current token at p, K
    drafts (from `propose[p]`, or n-gram lookup when None), the longest prefix equal to the target's tokens,
    then p moves past the accepted drafts and the target's bonus token. Rounds stop where fewer than K
    tokens are left."""
    counts, p = [], prompt_len
    while p + k < len(tokens):
        drafts = propose[p] if propose is not None else ngram_propose(tokens[: p + 1], 1, 4, k)
        accepted = accepted_prefix_length(drafts, tokens[p + 1 :])
        if drafts:  # an n-gram miss makes no draft
            counts.append((p, accepted))
        p += accepted + 1
    return counts


@torch.no_grad()
def measure(
    model: DFlashDraftModel, target: Qwen3ForCausalLM, data: Distillation, args: argparse.Namespace
) -> tuple[Acceptance, Acceptance]:
    """Simulated acceptance of the drafter and of n-gram lookup on `data`, K = block_size - 1."""
    k = args.block_size - 1
    model.eval()
    dflash, ngram = Acceptance(k, [0] * (k + 1)), Acceptance(k, [0] * (k + 1))
    for i in range(len(data.tokens)):
        prompt_len = int(data.prompt_lens[i])
        anchors = torch.arange(prompt_len, data.seq_len - k)[None, :]  # (1, A): every generated position
        blocks = make_blocks(data.tokens[i : i + 1], anchors, args.block_size, k, args.mask_token_id)
        logits = draft_logits(model, target, data.features[i : i + 1], blocks, args.anchor, k)
        drafts = dict(zip(anchors[0].tolist(), logits.argmax(-1)[0].tolist(), strict=True))
        tokens = data.tokens[i].tolist()
        for _, n in walk(tokens, prompt_len, k, drafts):
            dflash.hist[n] += 1
        for _, n in walk(tokens, prompt_len, k, None):
            ngram.hist[n] += 1
    model.train()
    return dflash, ngram


BlockLogits = Callable[[int, Blocks], Tensor]  # (sample i, its one block) -> (1, 1, K, vocab) draft logits


def zlab_block_logits(
    model: DFlashDraftModel, target: Qwen3ForCausalLM, data: Distillation, args: argparse.Namespace
) -> BlockLogits:
    """`draft_logits` of a drafter in z-lab's layout at one block of sample i."""
    k = args.block_size - 1
    return lambda i, blocks: draft_logits(model, target, data.features[i : i + 1], blocks, args.anchor, k)


@torch.no_grad()
def check_against_engine(
    folder: Path,
    target_folder: Path,
    model: torch.nn.Module,
    data: Distillation,
    args: argparse.Namespace,
    num_drafts: int,
    block_logits: BlockLogits,
) -> int:
    """Load `folder` with the engine's DFlashDrafter beside the engine's own target and compare its
    proposals (K = num_drafts) with the argmax of the training forward's `block_logits` at one anchor of
    each sample sequence; raises on a difference. Returns the number of blocks compared."""
    k = num_drafts
    page = 16
    samples = min(8, len(data.tokens))
    runner = ModelRunner(target_folder, torch.device("cpu"), num_kv_blocks=samples * data.seq_len // page + 1)
    drafter = DFlashDrafter(folder, runner, k)
    queries, expected = [], []
    model.eval()
    for i in range(samples):
        tokens = data.tokens[i].tolist()
        p = int(data.prompt_lens[i]) + 5 * i  # an anchor among the generated tokens
        block_ids = list(range(i * data.seq_len // page, (i + 1) * data.seq_len // page))
        aux = runner.execute(
            chunk_step([SeqChunk(tokens[:p], 0, block_ids)], runner), drafter.aux_layer_ids
        ).aux
        assert aux is not None  # asked for
        drafter.extend_context(context_rows([ContextUpdate(block_ids, 0, aux)], drafter.page_size))
        queries.append(DraftQuery(tokens[p], p, block_ids, k, tokens[: p + 1]))
        blocks = make_blocks(
            data.tokens[i : i + 1], torch.tensor([[p]]), args.block_size, k, args.mask_token_id
        )
        expected.append(block_logits(i, blocks))
    proposed = drafter.propose(queries)
    model.train()
    for i, (drafts, logits) in enumerate(zip(proposed, expected, strict=True)):
        mine = logits[0, 0].argmax(-1).tolist()
        if drafts != mine:
            # A float near-tie may flip an argmax; anything else is a real difference.
            top2 = logits[0, 0].topk(2, dim=-1).values
            gaps = (top2[:, 0] - top2[:, 1]).tolist()
            first = next(j for j in range(k) if drafts[j] != mine[j])
            if gaps[first] > 1e-3:
                raise SystemExit(f"sample {i}: engine drafts {drafts}, training forward {mine}")
    return samples


def write_card(
    args: argparse.Namespace,
    split: TokenSplit,
    data_seconds: float,
    train_seconds: float,
    train_loss: float,
    val_loss: float,
    dflash: Acceptance,
    ngram: Acceptance,
    history: list[dict[str, float]],
    compared: int,
) -> None:
    k = args.block_size - 1
    num_params = sum(p.numel() for p in DFlashDraftModel(DFlashConfig.from_folder(args.out_dir)).parameters())
    curve = "\n".join(f"| {h['step']} | {h['loss']:.3f} | {h['val_mean_accepted']:.3f} |" for h in history)

    def row(name: str, acc: Acceptance) -> str:
        rates = " ".join(f"{r:.3f}" for r in acc.per_position())
        hist = " / ".join(map(str, acc.hist))
        zero, full = 100 * acc.hist[0] / max(1, acc.rounds), 100 * acc.hist[-1] / max(1, acc.rounds)
        return f"| {name} | {acc.rounds} | {acc.mean_accepted:.3f} | {zero:.1f}% | {full:.1f}% | {hist} | {rates} |"

    card = f"""# openinfer built-in DFlash drafter

A {num_params / 1e6:.2f}M-parameter DFlash block drafter in z-lab's checkpoint layout, distilled from the \
built-in target (`../target/`): {args.num_layers} draft layers of the target's sizes, context features from \
target layers {args.target_layer_ids} (fc -> hidden_norm -> each layer's extra keys/values), block size \
{args.block_size} (the current token then {args.block_size - 1} mask tokens, mask token id \
{args.mask_token_id}, the NUL byte, which never occurs in text), {LAYOUTS[args.anchor]}; trained for \
K = {k}: `--spec-method dflash --num-spec-tokens {k}`, what `openinfer-serve` runs by default. The layout and \
the depth were chosen by 400-step pilots (`docs/benchmarks.md`). It shares the target's embedding and LM \
head.

- **Data**: {args.num_sequences} sequences of {args.seq_len} tokens: prompts of {", ".join(map(str, PROMPT_LENS))} \
tokens cut from the training part of `{args.dataset.name}` (the first 90 % of its tokens), continued \
greedily by the target (it learns the target's own temperature-0 text): {format_minutes(data_seconds)} to \
generate and featurize.
- **Command**: `{command_line()}`
- **Training**: {args.steps} steps of {args.batch_size} sequences x {args.anchors} draft blocks at random \
generated positions; loss = cross-entropy of the {k} draft slots against the target's greedy tokens, slot k \
weighted by exp(-(k-1)/{args.loss_decay}); AdamW (peak lr {args.lr}, {args.warmup} warm-up steps, cosine to a \
tenth), {"bfloat16 autocast" if not args.no_autocast else "float32"}, seed {args.seed}, {args.threads} CPU \
thread(s): {format_minutes(train_seconds)}.
- **Final loss** (float32, weighted mean over the slots, nats): training {train_loss:.3f}, held out \
{val_loss:.3f}.
- **Checked**: loaded by the engine's `DFlashDrafter`, it proposes what the training forward does on \
{compared} held-out blocks.

Acceptance at temperature 0, simulated on {args.num_val_sequences} held-out prompts (the last 10 % of the \
text) continued greedily by the target, K = {k}, each round as the engine runs it (the served figures, from \
`openinfer-bench sweep`, are in `docs/benchmarks.md`):

| drafter | rounds | mean accepted draft | zero-accept | full-{k} | histogram 0..{k} | per-position rates |
|---|---:|---:|---:|---:|---|---|
{row(f"DFlash K={k}", dflash)}
{row(f"n-gram K={k} (n in [1, 4])", ngram)}

| step | training loss (batch) | held-out mean accepted |
|---:|---:|---:|
{curve}
"""
    (args.out_dir / "README.md").write_text(card)
    summary = {
        "dflash_mean_accepted": dflash.mean_accepted,
        "ngram_mean_accepted": ngram.mean_accepted,
        "train_loss": train_loss,
        "val_loss": val_loss,
        "train_seconds": train_seconds,
        "rounds": dflash.rounds,
    }
    print(json.dumps(summary))
