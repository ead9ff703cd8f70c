"""Greedy tokens of the engine core equal Hugging Face transformers' on the same checkpoint (invariant 1)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.testing.engine_cores import make_core
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.protocol import EngineCoreRequest, SamplingParams

# Small enough for 2 CPU cores, wide enough (init_std) that greedy output is not one repeated token.
SMALL = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
NEAR_TIE = 1e-3


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 3, 7, 16, 17, 33, 50, 90][:n]  # mixed: under, at and over block boundaries (16)
    return [[rng.randrange(3, 512) for _ in range(length)] for length in lengths]


def generate(core: EngineCore, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Run all prompts as one concurrent batch; return each request's output tokens."""
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    finished = set()
    for _ in range(10_000):
        for out in core.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finish is not None:
                assert out.finish.kind == "length", out.finish
                finished.add(out.request_id)
        if not core.has_work:
            break
    assert finished == set(outputs)
    return [outputs[str(i)] for i in range(len(prompts))]


@torch.inference_mode()
def teacher_forced_logits(hf: Qwen3ForCausalLM, prompt: list[int], output: list[int]) -> torch.Tensor:
    """HF's logits, as float32 (len(output), vocab): row i is what HF predicts for output[i]."""
    logits = hf(torch.tensor([prompt + output])).logits[0].float()  # (len(prompt) + len(output), vocab)
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(output)]


def assert_hf_greedy(folder: Path, prompts: list[list[int]], outputs: list[list[int]]) -> None:
    """Teacher-forced: each produced token is HF's argmax at its position, or within NEAR_TIE of it."""
    hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for prompt, output in zip(prompts, outputs, strict=True):
        for i, (token, row) in enumerate(zip(output, teacher_forced_logits(hf, prompt, output), strict=True)):
            gap = (row.max() - row[token]).item()
            assert gap <= NEAR_TIE, (
                f"token {i} of a {len(prompt)}-token prompt: {token} is {gap} below argmax"
            )


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_greedy_matches_transformers(tmp_path: Path, tied: bool) -> None:
    """8 mixed prompts in one concurrent batch, chunked prefill on: every token is HF's greedy token."""
    folder = make_tiny_checkpoint(tmp_path / "ckpt", seed=1, tie_word_embeddings=tied, overrides=SMALL)
    prompts = make_prompts(8)
    outputs = generate(make_core(folder, max_num_batched_tokens=64), prompts, max_tokens=24)
    assert sum(len(set(o)) for o in outputs) > 8 * 4  # not one repeated token per request
    assert_hf_greedy(folder, prompts, outputs)


def test_greedy_matches_transformers_under_preemption(tmp_path: Path) -> None:
    """A KV cache too small for the batch forces preemption by recompute; the tokens stay HF's."""
    folder = make_tiny_checkpoint(tmp_path / "ckpt", seed=2, overrides=SMALL)
    prompts = make_prompts(8)
    # 16 blocks of 16 = 256 slots; the batch needs ~8*24 + 207 prompt tokens = ~400, so some must wait and
    # running requests are preempted when decoding outgrows the cache.
    core = make_core(folder, num_kv_blocks=16, max_num_batched_tokens=128)
    preempted = []
    schedule = core.scheduler.schedule

    def spy():  # counts preemptions as they happen
        out = schedule()
        preempted.extend(out.preempted)
        return out

    core.scheduler.schedule = spy  # type: ignore[method-assign]
    outputs = generate(core, prompts, max_tokens=24)
    assert preempted, "the test must force at least one preemption"
    assert_hf_greedy(folder, prompts, outputs)
    # The same tokens as with a roomy cache: recompute changes nothing.
    assert outputs == generate(make_core(folder), prompts, max_tokens=24)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_matches_transformers_on_cuda(tmp_path: Path) -> None:
    """On CUDA in float32 (flash-attn if installed, else torch) the batch's tokens are HF's greedy tokens."""
    folder = make_tiny_checkpoint(tmp_path / "ckpt", seed=1, overrides=SMALL)
    prompts = make_prompts(8)
    core = make_core(folder, device="cuda:0", dtype="float32", max_num_batched_tokens=64)
    outputs = generate(core, prompts, max_tokens=24)
    assert_hf_greedy(folder, prompts, outputs)
    # bfloat16, the CUDA default, runs the same batch to the end.
    assert all(len(o) == 24 for o in generate(make_core(folder, device="cuda:0"), prompts, max_tokens=24))
