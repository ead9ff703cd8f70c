"""Invariant 1's oracle: Hugging Face transformers' greedy choice, teacher-forced on the engine's tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

# The largest logit gap below HF's argmax a produced token may have: a float near-tie, the only allowed
# difference between our kernels and HF's (docs/design.md, invariant 1).
NEAR_TIE = 1e-3


@torch.inference_mode()
def teacher_forced_logits(hf: PreTrainedModel, prompt: list[int], output: list[int]) -> torch.Tensor:
    """HF's logits, as float32 (len(output), vocab): row i is what HF predicts for output[i]."""
    logits = hf(torch.tensor([prompt + output])).logits[0].float()  # (len(prompt) + len(output), vocab)
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(output)]


def assert_hf_greedy(
    folder: Path,
    prompts: list[list[int]],
    outputs: list[list[int]],
    load: Callable[[Path], Any] | None = None,
) -> None:
    """Teacher-forced: each produced token is HF's argmax at its position, or within NEAR_TIE of it.
    Raises AssertionError naming the first token that is not. ``load`` builds HF's model from the folder
    (default: AutoModelForCausalLM in float32, Qwen3 or Qwen3-MoE)."""
    if load is None:
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    else:
        hf = load(folder)
    for prompt, output in zip(prompts, outputs, strict=True):
        for i, (token, row) in enumerate(zip(output, teacher_forced_logits(hf, prompt, output), strict=True)):
            gap = (row.max() - row[token]).item()
            assert gap <= NEAR_TIE, (
                f"token {i} of a {len(prompt)}-token prompt: {token} is {gap} below argmax"
            )
