"""Distil the built-in DFlash drafter from the built-in target. Run once by the project (after
tools/train_target.py); the output folder is committed as package data.

    python tools/train_dflash.py ../shared/datasets/tinyshakespeare.txt [--target engine_core/builtin/target]
        [--out-dir engine_core/builtin/dflash] [--work-dir runs/train_dflash] [--steps 1200] [--seed 0]

1. Data: prompts cut from the training part of the text (the last tenth stays held out, as for the target),
   continued greedily by the target (batched, over a KV cache): the drafter learns the target's OWN greedy text,
   which is what it must predict when serving at temperature 0. Prompt lengths vary (PROMPT_LENS); every
   sequence is SEQ_LEN tokens. The target's outputs of decoder layers --target-layer-ids at every position
   are the context features, computed once in float32.
2. Model: `DFlashDraftModel` from the engine (the same modules, so the same parameter names), run by
   `draft_hidden` below in a training form: many draft blocks of one sequence in one pass. Each block is the
   current token at an anchor position p (a generated token) then mask tokens at p+1..p+block_size-1; it
   sees the context keys/values of positions < p (fc -> hidden_norm -> each layer's k/v) and its own block,
   non-causally, exactly as `DFlashDrafter.propose` does. The target's embedding and LM head are shared and
   frozen.
3. Loss: cross-entropy of the draft slots against the target's greedy tokens at p+1..p+K, slot k weighted by
   exp(-(k-1)/--loss-decay) (an early slot's miss ends the round, so early slots count more).
4. Checks: the simulated greedy acceptance on held-out prompts (rounds walk the continuation as the engine
   does, K = block_size - 1 drafts each) for the drafter and for n-gram lookup (vLLM's, n in [1, 4]); then
   the written folder is loaded with the engine's `DFlashDrafter` next to the engine's target and its
   proposals must equal this script's forward on held-out samples.

Seeded; step s trains on the batch drawn by a generator seeded with (seed, s), and a checkpoint written to
--work-dir every --checkpoint-every steps is picked up automatically, so a resumed run ends where an
uninterrupted one does. Writes config.json and model.safetensors in z-lab's layout (through
`write_dflash_checkpoint`, as `make_tiny_dflash_checkpoint` does) and README.md, the model card.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm
from training import (
    BUILTIN_DIR,
    DEFAULT_DATASET,
    REPO_ROOT,
    TokenSplit,
    builtin_tokenizer,
    command_line,
    cosine_lr,
    format_minutes,
    load_split,
    resume,
    save_checkpoint,
)
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.executor import SeqChunk
from openinfer.engine_core.model_runner import ModelRunner
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
from openinfer.engine_core.models.qwen3 import apply_rope
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.drafter import ContextUpdate, DraftQuery
from openinfer.engine_core.spec_decode.ngram import ngram_propose
from openinfer.engine_core.testing.dflash_checkpoint import dflash_checkpoint_config, write_dflash_checkpoint

SEQ_LEN = 192  # prompt + greedy continuation, every sequence
PROMPT_LENS = (8, 32, 64, 96)  # a quarter of the sequences each: short chat-like to bench-like prompts
NUL_BYTE_TOKEN = "\u0100"  # byte-level BPE's symbol for the byte 0x00
LAYOUTS = {  # for the model card
    AnchorLayout.MASK_SLOTS: (
        "z-lab's `mask_slots` layout (`sample_from_anchor: false`): slot i >= 1 drafts position p+i"
    ),
    AnchorLayout.ANCHOR_SLOT: (
        "the `anchor_slot` layout (`sample_from_anchor: true`, DSpark's; openinfer reads it, vLLM's DFlash path "
        "refuses it): slot i drafts position p+i+1, so the current token's own slot drafts the next token"
    ),
}


@dataclass(frozen=True)
class Distillation:
    """The target's greedy sequences and their context features."""

    tokens: Tensor  # (N, SEQ_LEN) int64: prompt then the target's greedy continuation
    prompt_lens: Tensor  # (N,) int64
    features: Tensor  # (N, SEQ_LEN, len(layer_ids) * hidden) float32: target layer outputs, concatenated


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", type=Path, nargs="?", default=DEFAULT_DATASET, help="tinyshakespeare.txt")
    parser.add_argument("--target", type=Path, default=BUILTIN_DIR / "target", help="the trained target")
    parser.add_argument("--out-dir", type=Path, default=BUILTIN_DIR / "dflash", help="the drafter folder")
    parser.add_argument(
        "--work-dir", type=Path, default=REPO_ROOT / "runs" / "train_dflash", help="data and checkpoint"
    )
    parser.add_argument("--num-layers", type=int, default=3, help="draft decoder layers")
    parser.add_argument("--block-size", type=int, default=8, help="draft block: current token + masks")
    parser.add_argument(
        "--anchor",
        choices=[a.value for a in AnchorLayout],
        default="anchor_slot",
        help="which block slots draft: anchor_slot (slot i drafts p+i+1) beat z-lab's mask_slots here",
    )
    parser.add_argument("--target-layer-ids", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-sequences", type=int, default=4096, help="greedy sequences to train on")
    parser.add_argument("--num-val-sequences", type=int, default=64, help="held-out sequences to measure on")
    parser.add_argument("--gen-batch", type=int, default=256, help="sequences generated at once")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--anchors", type=int, default=32, help="draft blocks per sequence per step")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--loss-decay", type=float, default=4.0, help="slot k's weight is exp(-(k-1)/this)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--no-autocast",
        action="store_true",
        help="train in float32 (faster on CPUs without bf16 instructions)",
    )
    args = parser.parse_args()
    args.anchor = AnchorLayout(args.anchor)
    return args


# ---- data: the target's own greedy continuations --------------------------------------------------------


def load_target(folder: Path) -> Qwen3ForCausalLM:
    target = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    target.requires_grad_(False)
    return target


@torch.no_grad()
def greedy_sequences(
    target: Qwen3ForCausalLM, part: Tensor, count: int, gen_batch: int, seed: int, desc: str
) -> tuple[Tensor, Tensor]:
    """`count` sequences of SEQ_LEN tokens: a prompt cut from `part` at a seeded offset (a quarter of them
    for each of PROMPT_LENS), then the target's greedy continuation, never stopped by EOS (the bench runs
    with ignore_eos). Returns tokens (count, SEQ_LEN) and prompt lengths (count,)."""
    generator = torch.Generator().manual_seed(seed)
    jobs = []  # (prompt_len, n): generation batches
    for j, prompt_len in enumerate(PROMPT_LENS):
        group = count // len(PROMPT_LENS) + (j < count % len(PROMPT_LENS))
        jobs += [(prompt_len, min(gen_batch, group - s)) for s in range(0, group, gen_batch)]
    tokens, prompt_lens = [], []
    for prompt_len, n in tqdm(jobs, desc=desc, unit="batch"):
        offsets = torch.randint(0, len(part) - prompt_len, (n,), generator=generator)
        prompts = part[offsets[:, None] + torch.arange(prompt_len)[None, :]]  # (n, prompt_len)
        out = target(input_ids=prompts, use_cache=True)
        generated = [out.logits[:, -1].argmax(-1)]  # each (n,)
        for _ in range(SEQ_LEN - prompt_len - 1):
            out = target(input_ids=generated[-1][:, None], cache=out.cache, use_cache=True)
            generated.append(out.logits[:, -1].argmax(-1))
        tokens.append(torch.cat((prompts, torch.stack(generated, dim=1)), dim=1))  # (n, SEQ_LEN)
        prompt_lens.append(torch.full((n,), prompt_len))
    return torch.cat(tokens), torch.cat(prompt_lens)


@torch.no_grad()
def context_features(target: Qwen3ForCausalLM, tokens: Tensor, layer_ids: list[int]) -> Tensor:
    """(N, SEQ_LEN) -> (N, SEQ_LEN, len(layer_ids) * hidden): the outputs of decoder layers `layer_ids`
    (transformers' hidden_states[i + 1]; what the engine's forward_with_aux returns), float32."""
    chunks = []
    for batch in tokens.split(64):
        hidden = target(input_ids=batch, output_hidden_states=True).hidden_states
        chunks.append(torch.cat([hidden[i + 1] for i in layer_ids], dim=-1))
    return torch.cat(chunks)


def distillation_data(
    args: argparse.Namespace, target: Qwen3ForCausalLM, part: Tensor, count: int, seed: int, name: str
) -> Distillation:
    """Generate (or reload from --work-dir) the greedy sequences, then compute their features."""
    path = args.work_dir / f"{name}-{target_digest(args.target)}-{count}-{seed}-{SEQ_LEN}.pt"
    if path.is_file():
        tokens, prompt_lens = torch.load(path)
    else:
        tokens, prompt_lens = greedy_sequences(target, part, count, args.gen_batch, seed, f"generate {name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save((tokens, prompt_lens), path)
    return Distillation(tokens, prompt_lens, context_features(target, tokens, args.target_layer_ids))


def target_digest(folder: Path) -> str:
    """Short hash of the target's weights: data and checkpoints of another target are not reused."""
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]


def mask_token(split: TokenSplit) -> int:
    """The byte token of NUL: a token no text uses (checked against the whole dataset), so its embedding
    (the target's) means nothing but "mask"."""
    mask = builtin_tokenizer().token_to_id(NUL_BYTE_TOKEN)
    if bool((split.train == mask).any() or (split.val == mask).any()):
        raise SystemExit(f"the mask token {mask} ({NUL_BYTE_TOKEN!r}) occurs in the dataset")
    return mask


# ---- the drafter's forward, many blocks at once -----------------------------------------------------------


def draft_hidden(
    model: DFlashDraftModel, features: Tensor, block_embeds: Tensor, block_positions: Tensor, key_mask: Tensor
) -> Tensor:
    """`DFlashDraftModel.forward` over many blocks of one sequence per row, context computed in place.

    features (B, L, width): target features at positions 0..L-1; block_embeds (B, Q, hidden): every block's
    token embeddings, Q = blocks * block_size; block_positions (B, Q); key_mask (B, Q, L + Q) bool: a query
    sees context position j < its block's anchor and the keys of its own block. -> (B, Q, hidden) after the
    final norm, as `DFlashDraftModel.forward` returns it."""
    b, length, _ = features.shape
    q_len = block_embeds.shape[1]
    f = model.hidden_norm(model.fc(features)).flatten(0, 1)  # (B * L, hidden)
    context_positions = torch.arange(length).repeat(b)  # (B * L,)
    cos_c, sin_c = model.rotary.cos_sin(context_positions, f.dtype)  # (B * L, head_dim)
    cos_b, sin_b = model.rotary.cos_sin(block_positions.flatten(), block_embeds.dtype)  # (B * Q, head_dim)
    x = block_embeds
    for layer in model.layers:
        attn = layer.self_attn
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        context_k, context_v = attn.context_kv(f, cos_c, sin_c)  # (B * L, kv_heads, dim) each
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(b * q_len, heads, dim))
        k = attn.k_norm(attn.k_proj(h).view(b * q_len, kv_heads, dim))
        q = apply_rope(q, cos_b, sin_b).view(b, q_len, heads, dim)
        k = apply_rope(k, cos_b, sin_b).view(b, q_len, kv_heads, dim)
        v = attn.v_proj(h).view(b, q_len, kv_heads, dim)
        keys = torch.cat((context_k.view(b, length, kv_heads, dim), k.to(context_k.dtype)), dim=1)
        values = torch.cat((context_v.view(b, length, kv_heads, dim), v.to(context_v.dtype)), dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # (B, heads, Q, dim)
            keys.transpose(1, 2).to(q.dtype),  # (B, kv_heads, L + Q, dim)
            values.transpose(1, 2).to(q.dtype),
            attn_mask=key_mask[:, None],  # (B, 1, Q, L + Q)
            scale=attn.scale,
            enable_gqa=heads != kv_heads,
        )  # (B, heads, Q, dim)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, q_len, heads * dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


@dataclass(frozen=True)
class Blocks:
    """Draft blocks at chosen anchors of B sequences, laid out for `draft_hidden`."""

    token_ids: Tensor  # (B, A, block_size): the anchor's token, then mask tokens
    positions: Tensor  # (B, A, block_size): anchor + 0 .. block_size - 1
    key_mask: Tensor  # (B, A * block_size, L + A * block_size) bool
    labels: Tensor  # (B, A, K): the target's greedy tokens at anchor + 1 .. anchor + K


def make_blocks(tokens: Tensor, anchors: Tensor, block_size: int, num_drafts: int, mask_id: int) -> Blocks:
    """tokens (B, L), anchors (B, A) with anchor + num_drafts < L."""
    b, a = anchors.shape
    length = tokens.shape[1]
    offsets = torch.arange(block_size)
    positions = anchors[:, :, None] + offsets  # (B, A, block)
    token_ids = torch.full((b, a, block_size), mask_id, dtype=torch.int64)
    token_ids[:, :, 0] = tokens.gather(1, anchors)
    label_positions = anchors[:, :, None] + 1 + torch.arange(num_drafts)  # (B, A, K)
    labels = tokens.gather(1, label_positions.flatten(1)).view(b, a, num_drafts)
    block_of_query = torch.arange(a).repeat_interleave(block_size)  # (Q,)
    anchor_of_query = anchors.repeat_interleave(block_size, dim=1)  # (B, Q)
    sees_context = torch.arange(length)[None, None, :] < anchor_of_query[:, :, None]  # (B, Q, L)
    sees_block = (block_of_query[:, None] == block_of_query[None, :]).expand(b, -1, -1)  # (B, Q, Q)
    return Blocks(token_ids, positions, torch.cat((sees_context, sees_block), dim=2), labels)


def draft_logits(
    model: DFlashDraftModel,
    target: Qwen3ForCausalLM,
    features: Tensor,
    blocks: Blocks,
    anchor: AnchorLayout,
    num_drafts: int,
) -> Tensor:
    """(B, A, K, vocab) float32: the draft slots' logits through the target's (frozen) LM head."""
    b, a, block_size = blocks.token_ids.shape
    embeds = target.get_input_embeddings()(blocks.token_ids.flatten(1))  # (B, Q, hidden)
    hidden = draft_hidden(model, features, embeds, blocks.positions.flatten(1), blocks.key_mask)
    first = anchor.first_draft_slot
    slots = hidden.view(b, a, block_size, -1)[:, :, first : first + num_drafts]  # (B, A, K, hidden)
    return F.linear(slots, target.get_output_embeddings().weight).float()


def sample_anchors(prompt_lens: Tensor, count: int, num_drafts: int, generator: torch.Generator) -> Tensor:
    """(B, count) anchor positions in [prompt_len, SEQ_LEN - 1 - num_drafts]: generated tokens only, so
    that every label is the target's greedy continuation of the block's own context."""
    low = prompt_lens[:, None].float()
    span = (SEQ_LEN - num_drafts) - low  # positions available per sequence
    return (low + torch.rand(len(prompt_lens), count, generator=generator) * span).long()


# ---- measuring: simulated greedy speculation --------------------------------------------------------------


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


def walk(tokens: list[int], prompt_len: int, k: int, propose: dict[int, list[int]] | None) -> list[int]:
    """Accepted counts of the rounds the engine runs on one greedy sequence: the current token at p, K
    drafts (from `propose[p]`, or n-gram lookup when None), the longest prefix equal to the target's tokens,
    then p moves past the accepted drafts and the target's bonus token. Rounds stop where fewer than K
    tokens are left."""
    counts, p = [], prompt_len
    while p + k < len(tokens):
        drafts = propose[p] if propose is not None else ngram_propose(tokens[: p + 1], 1, 4, k)
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == tokens[p + 1 + accepted]:
            accepted += 1
        if drafts:  # an n-gram miss makes no draft
            counts.append(accepted)
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
        anchors = torch.arange(prompt_len, SEQ_LEN - k)[None, :]  # (1, A): every generated position
        blocks = make_blocks(data.tokens[i : i + 1], anchors, args.block_size, k, args.mask_token_id)
        logits = draft_logits(model, target, data.features[i : i + 1], blocks, args.anchor, k)
        drafts = dict(zip(anchors[0].tolist(), logits.argmax(-1)[0].tolist(), strict=True))
        tokens = data.tokens[i].tolist()
        for n in walk(tokens, prompt_len, k, drafts):
            dflash.hist[n] += 1
        for n in walk(tokens, prompt_len, k, None):
            ngram.hist[n] += 1
    model.train()
    return dflash, ngram


@torch.no_grad()
def check_against_engine(
    folder: Path,
    target_folder: Path,
    target: Qwen3ForCausalLM,
    model: DFlashDraftModel,
    data: Distillation,
    args: argparse.Namespace,
) -> int:
    """Load `folder` with the engine's DFlashDrafter beside the engine's own target and compare its
    proposals with `draft_logits`' argmax at one anchor of each sample sequence; raises on a difference.
    Returns the number of blocks compared."""
    k = args.block_size - 1
    page = 16
    samples = min(8, len(data.tokens))
    runner = ModelRunner(target_folder, torch.device("cpu"), num_kv_blocks=samples * SEQ_LEN // page + 1)
    drafter = DFlashDrafter(folder, runner, k)
    queries, expected = [], []
    for i in range(samples):
        tokens = data.tokens[i].tolist()
        p = int(data.prompt_lens[i]) + 5 * i  # an anchor among the generated tokens
        block_ids = list(range(i * SEQ_LEN // page, (i + 1) * SEQ_LEN // page))
        _, aux = runner.execute_with_aux([SeqChunk(tokens[:p], 0, block_ids)], drafter.aux_layer_ids)
        drafter.extend_context([ContextUpdate(block_ids, 0, aux)])
        queries.append(DraftQuery(tokens[p], p, block_ids, k, tokens[: p + 1]))
        blocks = make_blocks(
            data.tokens[i : i + 1], torch.tensor([[p]]), args.block_size, k, args.mask_token_id
        )
        expected.append(draft_logits(model.eval(), target, data.features[i : i + 1], blocks, args.anchor, k))
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


# ---- training ---------------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    began_all = time.monotonic()
    split = load_split(args.dataset, builtin_tokenizer())
    args.mask_token_id = mask_token(split)
    k = args.block_size - 1
    target = load_target(args.target)
    target_config = ModelConfig.from_folder(args.target)
    config = dflash_checkpoint_config(
        target_config,
        num_layers=args.num_layers,
        block_size=args.block_size,
        target_layer_ids=tuple(args.target_layer_ids),
        mask_token_id=args.mask_token_id,
        anchor=args.anchor,
    )
    model = new_drafter(config, args.seed)

    train = distillation_data(args, target, split.train, args.num_sequences, args.seed, "train")
    val = distillation_data(args, target, split.val, args.num_val_sequences, args.seed + 1, "val")
    data_seconds = time.monotonic() - began_all

    fingerprint = {
        key: getattr(args, key)
        for key in (
            "num_layers",
            "block_size",
            "target_layer_ids",
            "num_sequences",
            "steps",
            "batch_size",
            "anchors",
            "lr",
            "warmup",
            "weight_decay",
            "loss_decay",
            "seed",
            "mask_token_id",
        )
    } | {"anchor": args.anchor.value, "autocast": not args.no_autocast, "target": target_digest(args.target)}
    optimizer = make_optimizer(model, args)
    slot_weights = slot_weight_vector(k, args.loss_decay)
    checkpoint_path = args.work_dir / "checkpoint.pt"
    start, elapsed, history = resume(checkpoint_path, fingerprint, model, optimizer)

    began = time.monotonic() - elapsed
    bar = tqdm(total=args.steps, initial=start, desc="dflash", unit="step")
    accepted = history[-1]["val_mean_accepted"] if history else float("nan")

    def after_step(done: int, loss: float, lr: float) -> None:
        nonlocal accepted
        if done % args.eval_every == 0 or done == args.steps:
            dflash, _ = measure(model, target, val, args)
            accepted = dflash.mean_accepted
            history.append({"step": done, "loss": loss, "val_mean_accepted": accepted})
        bar.set_postfix(loss=f"{loss:.3f}", accepted=f"{accepted:.3f}", lr=f"{lr:.1e}")
        bar.update(1)
        if done % args.checkpoint_every == 0 or done == args.steps:
            save_checkpoint(
                checkpoint_path,
                {
                    "fingerprint": fingerprint,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": done,
                    "elapsed": time.monotonic() - began,
                    "history": history,
                },
            )

    train_steps(model, target, train, args, optimizer, start, after_step)
    bar.close()
    train_seconds = time.monotonic() - began

    dflash, ngram = measure(model, target, val, args)
    train_loss = slot_losses(model, target, train, args, slot_weights)
    val_loss = slot_losses(model, target, val, args, slot_weights)
    print(f"held-out acceptance, DFlash K={k}: {dflash.describe()}")
    print(f"held-out acceptance, n-gram K={k}: {ngram.describe()}")
    print(f"final weighted loss (nats/slot): train {train_loss:.4f}, held out {val_loss:.4f}")

    if args.out_dir.exists():
        shutil.rmtree(args.out_dir)
    write_dflash_checkpoint(args.out_dir, config, dict(model.named_parameters()))
    compared = check_against_engine(args.out_dir, args.target, target, model, val, args)
    print(f"the engine's DFlashDrafter proposes what the training forward does on {compared} held-out blocks")
    write_card(
        args, split, data_seconds, train_seconds, train_loss, val_loss, dflash, ngram, history, compared
    )
    print(f"wrote {args.out_dir} in {format_minutes(time.monotonic() - began_all)}")


def new_drafter(config: dict, seed: int) -> DFlashDraftModel:
    """A drafter of `config` (config.json's dict) with Qwen3's initialisation, seeded."""
    torch.manual_seed(seed)
    model = DFlashDraftModel(DFlashConfig.from_dict(config))
    init_weights(model)
    return model


def make_optimizer(model: DFlashDraftModel, args: argparse.Namespace) -> torch.optim.Optimizer:
    """AdamW, weight decay on matrices only."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )


def slot_weight_vector(num_drafts: int, decay: float) -> Tensor:
    """(K,) loss weights of the draft slots, slot k's exp(-(k-1)/decay), summing to 1."""
    weights = torch.exp(-torch.arange(num_drafts, dtype=torch.float32) / decay)
    return weights / weights.sum()


def train_steps(
    model: DFlashDraftModel,
    target: Qwen3ForCausalLM,
    train: Distillation,
    args: argparse.Namespace,
    optimizer: torch.optim.Optimizer,
    start: int = 0,
    after_step: Callable[[int, float, float], None] | None = None,
) -> None:
    """Steps start .. args.steps - 1: each a batch of args.batch_size sequences x args.anchors draft blocks
    at seeded random generated positions, cross-entropy of the K draft slots against the target's greedy
    tokens (slot-weighted), cosine learning rate; `after_step(done, loss, lr)` after each."""
    k = args.block_size - 1  # both layouts are trained to draft block_size - 1 tokens
    slot_weights = slot_weight_vector(k, args.loss_decay)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    for step in range(start, args.steps):
        lr = cosine_lr(step, args.steps, args.lr, args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        rows = torch.randint(0, len(train.tokens), (args.batch_size,), generator=generator)
        anchors = sample_anchors(train.prompt_lens[rows], args.anchors, k, generator)
        blocks = make_blocks(train.tokens[rows], anchors, args.block_size, k, args.mask_token_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast):
            logits = draft_logits(model, target, train.features[rows], blocks, args.anchor, k)
        losses = F.cross_entropy(logits.flatten(0, 2), blocks.labels.flatten(), reduction="none")
        loss = (losses.view(-1, k) * slot_weights).sum(-1).mean()  # (B * A, K) weighted over slots
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if after_step is not None:
            after_step(step + 1, loss.item(), lr)
    model.eval()


def init_weights(model: DFlashDraftModel) -> None:
    """Qwen3's initialisation: matrices N(0, 0.02), norms 1 (DFlashDraftModel's own init is nn.Linear's)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)


@torch.no_grad()
def slot_losses(
    model: DFlashDraftModel,
    target: Qwen3ForCausalLM,
    data: Distillation,
    args: argparse.Namespace,
    slot_weights: Tensor,
) -> float:
    """The training loss in float32 at 16 fixed anchors of up to 256 of `data`'s sequences."""
    k = args.block_size - 1
    model.eval()
    generator = torch.Generator().manual_seed(12345)
    rows = torch.arange(min(256, len(data.tokens)))
    total = 0.0
    for chunk in rows.split(16):
        anchors = sample_anchors(data.prompt_lens[chunk], 16, k, generator)
        blocks = make_blocks(data.tokens[chunk], anchors, args.block_size, k, args.mask_token_id)
        logits = draft_logits(model, target, data.features[chunk], blocks, args.anchor, k)
        losses = F.cross_entropy(logits.flatten(0, 2), blocks.labels.flatten(), reduction="none")
        total += (losses.view(-1, k) * slot_weights).sum(-1).sum().item()
    model.train()
    return total / (len(rows) * 16)


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

- **Data**: {args.num_sequences} sequences of {SEQ_LEN} tokens: prompts of {", ".join(map(str, PROMPT_LENS))} \
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


if __name__ == "__main__":
    main()
