"""The built-in drafter's training data: the target's own greedy continuations and their context features.

Part of tools/train_dflash.py; imported as a sibling module, like training.py."""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm
from transformers import Qwen3ForCausalLM

from openinfer.tools.training import (
    TokenSplit,
    builtin_tokenizer,
)

SEQ_LEN = 192  # prompt + greedy continuation, every sequence


PROMPT_LENS = (8, 32, 64, 96)  # a quarter of the sequences each: short chat-like to bench-like prompts


NUL_BYTE_TOKEN = "\u0100"  # byte-level BPE's symbol for the byte 0x00


@dataclass(frozen=True)
class Distillation:
    """The target's greedy sequences and their context features."""

    tokens: Tensor  # (N, SEQ_LEN) int64: prompt then the target's greedy continuation
    prompt_lens: Tensor  # (N,) int64
    features: Tensor  # (N, SEQ_LEN, len(layer_ids) * hidden) float32: target layer outputs, concatenated


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
