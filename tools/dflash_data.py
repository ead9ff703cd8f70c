"""The built-in drafter's training data: the target's own greedy continuations and their context features.

Part of tools/train_dflash.py; imported as a sibling module, like training.py."""

from __future__ import annotations

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

SEQ_LEN = 192  # prompt + greedy continuation, every sequence of tools/train_dflash.py


PROMPT_LENS = (8, 32, 64, 96)  # a quarter of the sequences each: short chat-like to bench-like prompts


NUL_BYTE_TOKEN = "\u0100"  # byte-level BPE's symbol for the byte 0x00


@dataclass(frozen=True)
class Distillation:
    """The target's greedy sequences and their context features."""

    tokens: Tensor  # (N, L) int64: prompt then the target's greedy continuation
    prompt_lens: Tensor  # (N,) int64
    features: Tensor  # (N, L, len(layer_ids) * hidden) float32: target layer outputs, concatenated
    final: Tensor | None = (
        None  # (N, L, hidden) float32: the target's last hidden state, after its final norm
    )

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]


def load_target(folder: Path) -> Qwen3ForCausalLM:
    target = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    target.requires_grad_(False)
    return target


@torch.no_grad()
def target_sequences(
    target: Qwen3ForCausalLM, part: Tensor, spec: DataSpec, desc: str
) -> tuple[Tensor, Tensor]:
    """`spec.count` sequences of `spec.seq_len` tokens: a prompt cut from `part` at a seeded offset (a quarter
    of them for each of PROMPT_LENS), then the target's continuation, greedy or drawn from softmax(logits / T)
    at `spec.temperature` (no top-k or top-p), never stopped by EOS (the bench runs with ignore_eos).
    transformers' `generate` over a static KV cache (no copy of the cache per token). Returns tokens (count,
    seq_len) and prompt lengths (count,)."""
    count, seq_len, gen_batch = spec.count, spec.seq_len, spec.gen_batch
    generator = torch.Generator().manual_seed(spec.seed)
    torch.manual_seed(spec.seed)  # generate's draws come from the global generator
    jobs = []  # (prompt_len, n): generation batches
    for j, prompt_len in enumerate(PROMPT_LENS):
        group = count // len(PROMPT_LENS) + (j < count % len(PROMPT_LENS))
        jobs += [(prompt_len, min(gen_batch, group - s)) for s in range(0, group, gen_batch)]
    tokens, prompt_lens = [], []
    for prompt_len, n in tqdm(jobs, desc=desc, unit="batch"):
        offsets = torch.randint(0, len(part) - prompt_len, (n,), generator=generator)
        prompts = part[offsets[:, None] + torch.arange(prompt_len)[None, :]]  # (n, prompt_len)
        new = seq_len - prompt_len
        out = target.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=spec.temperature > 0,
            **({"temperature": spec.temperature, "top_k": 0, "top_p": 1.0} if spec.temperature > 0 else {}),
            cache_implementation="static",
            eos_token_id=None,
            pad_token_id=0,
        )
        tokens.append(out)  # (n, seq_len)
        prompt_lens.append(torch.full((n,), prompt_len))
    return torch.cat(tokens), torch.cat(prompt_lens)


@torch.no_grad()
def context_features(
    target: Qwen3ForCausalLM, tokens: Tensor, layer_ids: list[int], with_final: bool = False
) -> tuple[Tensor, Tensor | None]:
    """(N, L) -> the outputs of decoder layers `layer_ids` (transformers' hidden_states[i + 1]; what the
    engine's forward_with_aux returns), concatenated, (N, L, len(layer_ids) * hidden), and with `with_final`
    the last hidden state after the final norm (N, L, hidden) (the target's logits are its LM head of it);
    float32."""
    chunks, finals = [], []
    for batch in tokens.split(32):
        out = target.model(input_ids=batch, output_hidden_states=True)
        chunks.append(torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1))
        if with_final:
            finals.append(out.last_hidden_state)
    return torch.cat(chunks), torch.cat(finals) if with_final else None


@dataclass(frozen=True)
class DataSpec:
    """Which sequences to generate: a name for the cache file, how many, how long, the seed, and the
    temperature the target continues them at (0: greedily)."""

    name: str
    count: int
    seq_len: int
    seed: int
    gen_batch: int
    temperature: float = 0.0


def distillation_data(
    target: Qwen3ForCausalLM,
    target_folder: Path,
    part: Tensor,
    spec: DataSpec,
    cache_dir: Path,
    layer_ids: list[int],
    with_final: bool = False,
) -> Distillation:
    """Generate (or reload from `cache_dir`) the sequences `spec` names, then compute their features (and
    the target's final hidden states with `with_final`)."""
    sampled = f"-T{spec.temperature:g}" if spec.temperature > 0 else ""  # greedy files keep their names
    name = f"{spec.name}-{target_digest(target_folder)}-{spec.count}-{spec.seed}-{spec.seq_len}{sampled}.pt"
    path = cache_dir / name
    if path.is_file():
        tokens, prompt_lens = torch.load(path)
    else:
        tokens, prompt_lens = target_sequences(target, part, spec, f"generate {spec.name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save((tokens, prompt_lens), path)
    features, final = context_features(target, tokens, layer_ids, with_final)
    return Distillation(tokens, prompt_lens, features, final)


def target_digest(folder: Path) -> str:
    """Short hash of the target's weights: data and checkpoints of another target are not reused."""
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]


def mask_token(split: TokenSplit) -> int:
    """The byte token of NUL: a token no text uses (checked against the whole dataset), so its embedding
    (the target's) means nothing but "mask"."""
    mask = builtin_tokenizer().token_to_id(NUL_BYTE_TOKEN)
    if mask is None:
        raise SystemExit(
            f"the built-in tokenizer has no token {NUL_BYTE_TOKEN!r}: it is not the committed one"
        )
    if bool((split.train == mask).any() or (split.val == mask).any()):
        raise SystemExit(f"the mask token {mask} ({NUL_BYTE_TOKEN!r}) occurs in the dataset")
    return mask
