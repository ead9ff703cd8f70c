"""Speculative decoding over a Qwen3.5 (hybrid Gated DeltaNet) target: a verification keeps the state after each
of its tokens, the next step starts from the accepted one, so the tokens are those of a run without a drafter
(which are transformers'), whatever the acceptance length, through chunked prefill and preemption."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.engine_cores import CheckedSteps, generate_greedy, make_core
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.qwen3_5_checkpoint import (
    load_hf_text_model,
    make_repetitive_qwen3_5_checkpoint,
    repetitive_prompts,
)
from openinfer.protocol import EngineCoreRequest, SamplingParams

K = 4
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repetitive_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "t")


@pytest.fixture(scope="module")
def baseline(target: Path) -> list[list[int]]:
    outputs = generate_greedy(make_core(target), repetitive_prompts(), MAX_TOKENS)
    assert_hf_greedy(target, repetitive_prompts(), outputs, load_hf_text_model)
    return outputs


def run_checked(target: Path, spec: DrafterSpec, **overrides: object) -> tuple[list[list[int]], list[int]]:
    """All prompts as one greedy batch, the counters' invariants checked at every step: the tokens and the
    accepted-length histogram."""
    core = make_core(target, speculative=spec, **overrides)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(repetitive_prompts()):
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(repetitive_prompts()))}
    steps = CheckedSteps(core)
    for _ in range(2_000):  # bounded: every request ends within MAX_TOKENS steps of its prompt
        for out in steps.step():
            outputs[out.request_id] += out.new_token_ids
        if not core.has_work:
            break
    assert core.spec is not None
    return [
        outputs[str(i)] for i in range(len(repetitive_prompts()))
    ], core.spec.counters.accepted_length_hist


def test_ngram_is_lossless_at_every_acceptance_length(target: Path, baseline: list[list[int]]) -> None:
    """Prompt lookup K=4 on the repeating target: drafts accepted 0, 1, ..., 4 at a time (each length at
    least once), the tokens of the run without a drafter."""
    outputs, hist = run_checked(target, DrafterSpec("ngram", K))
    assert outputs == baseline
    assert all(count > 0 for count in hist), hist  # every acceptance length, rejections included


def test_ngram_through_chunked_prefill_and_preemption(target: Path, baseline: list[list[int]]) -> None:
    """12 tokens a step (prompts cut into chunks among verifications) and 30 blocks of 4 for 8 requests of up
    to 100 tokens (preemptions: a preempted request recomputes its state from position 0): same tokens."""
    outputs, _ = run_checked(
        target, DrafterSpec("ngram", K), max_num_batched_tokens=12, num_kv_blocks=30, block_size=4
    )
    assert outputs == baseline


def test_a_smaller_k_than_the_state_groups_hold(target: Path) -> None:
    """State groups are sized for the start drafter's K: a later drafter of larger K is refused, saying
    what to do; one of smaller K loads."""
    core = make_core(target, speculative=DrafterSpec("ngram", 2))
    with pytest.raises(ValueError, match=r"keeps 3 state slot\(s\) per request"):
        core.load_drafter(DrafterSpec("ngram", 3))
    core.load_drafter(DrafterSpec("ngram", 1))


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_block_drafters_are_lossless(
    target: Path, baseline: list[list[int]], tmp_path: Path, method: str
) -> None:
    """A random DFlash or DSpark drafter fed a DeltaNet layer (1) and the full-attention one (3): the tokens
    of the run without a drafter."""
    make = make_tiny_dflash_checkpoint if method == "dflash" else make_tiny_dspark_checkpoint
    draft = make(tmp_path / "draft", target, seed=1, block_size=8, target_layer_ids=(1, 3))
    outputs, _ = run_checked(target, DrafterSpec(method, 7, draft))
    assert outputs == baseline


def test_adaptive_verification_is_lossless(target: Path, baseline: list[list[int]]) -> None:
    """Prompt lookup with adaptive verification: the engine times verify-shaped steps at start (their state
    in the scratch slot), then verifies a share of each round's drafts: the tokens of the run without one."""
    # 64 tokens a step: the start-up profile times steps of 1, 2, 4, ..., 64 tokens, not up to 512
    spec = DrafterSpec("ngram", K, adaptive_verification=True)
    outputs, _ = run_checked(target, spec, max_num_batched_tokens=64)
    assert outputs == baseline
