"""Greedy tokens of the engine core equal Hugging Face transformers' on the same checkpoint (invariant 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core, mixed_length_prompts
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint

SMALL = SMALL_TEXT_QWEN3  # small enough for 2 CPU cores, wide enough (init_std) that output varies


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_greedy_matches_transformers(tmp_path: Path, tied: bool) -> None:
    """8 mixed prompts in one concurrent batch, chunked prefill on: every token is HF's greedy token."""
    folder = make_tiny_checkpoint(tmp_path / "ckpt", seed=1, tie_word_embeddings=tied, overrides=SMALL)
    prompts = mixed_length_prompts(8)
    outputs = generate_greedy(make_core(folder, max_num_batched_tokens=64), prompts, max_tokens=24)
    assert sum(len(set(o)) for o in outputs) > 8 * 4  # not one repeated token per request
    assert_hf_greedy(folder, prompts, outputs)


def test_greedy_matches_transformers_under_preemption(tmp_path: Path) -> None:
    """A KV cache too small for the batch forces preemption by recompute; the tokens stay HF's."""
    folder = make_tiny_checkpoint(tmp_path / "ckpt", seed=2, overrides=SMALL)
    prompts = mixed_length_prompts(8)
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
    outputs = generate_greedy(core, prompts, max_tokens=24)
    assert preempted, "the test must force at least one preemption"
    assert_hf_greedy(folder, prompts, outputs)
    # The same tokens as with a roomy cache: recompute changes nothing.
    assert outputs == generate_greedy(make_core(folder), prompts, max_tokens=24)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_matches_transformers_on_cuda(tmp_path: Path) -> None:
    """On CUDA in float32 (flash-attn if installed, else torch) the batch's tokens are HF's greedy tokens."""
    folder = make_tiny_checkpoint(tmp_path / "ckpt", seed=1, overrides=SMALL)
    prompts = mixed_length_prompts(8)
    core = make_core(folder, device="cuda:0", dtype="float32", max_num_batched_tokens=64)
    outputs = generate_greedy(core, prompts, max_tokens=24)
    assert_hf_greedy(folder, prompts, outputs)
    # bfloat16, the CUDA default, runs the same batch to the end.
    assert all(
        len(o) == 24 for o in generate_greedy(make_core(folder, device="cuda:0"), prompts, max_tokens=24)
    )
