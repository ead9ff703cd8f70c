"""A DSpark drafter with finite weights whose numbers overflow at run time (issue 39, item 3: "every request
fails with 500"): every request succeeds, greedy output is the output without speculation, the drafts of
non-finite slots read as confidence 0 (so a threshold or adaptive verification verifies none of them), the
counters equal the spec log, and the engine logs it once."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.spec_decode.draft_numbers import LOGIT_LIMIT, finite_logits
from openinfer.engine_core.spec_decode.draft_sampling import DraftSampling, draw_slot
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.engine_cores import generate_with, make_core, spec_prompts
from openinfer.engine_core.testing.spec_logs import read_spec_log, spec_log_counters
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from tests.engine_core.spec_decode.spec_runs import run

K = 7  # the DSpark checkpoint's block_size: it drafts all 7
HUGE = 3e38  # finite in float32 (max ~3.4e38): loads, then overflows in the first matmul
# The weights set, by case: a HUGE fc makes every hidden state (so every logit and confidence) NaN; a HUGE
# Markov output matrix over embeddings of ones adds 16 x HUGE = inf to every logit while the confidence
# head, reading h and e, stays finite.
OVERFLOWS = {
    "fc": {"fc.weight": HUGE},
    "markov": {"markov_head.markov_w2.weight": HUGE, "markov_head.markov_w1.weight": 1.0},
}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 layers of hidden size 64 over the built-in tokenizer's 512 tokens."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target"), seed=5, overrides=SMALL_TEXT_QWEN3)


@pytest.fixture(scope="module")
def baseline(target: Path) -> list[list[int]]:
    """The greedy tokens without speculation."""
    return run(make_core(target), spec_prompts())[0]


@pytest.fixture(scope="module", params=list(OVERFLOWS))
def drafter(request: pytest.FixtureRequest, target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DSpark drafter with the weights ``OVERFLOWS[param]`` (finite: the load takes them)."""
    good = make_tiny_dspark_checkpoint(tmp_path_factory.mktemp("good") / "d", target, seed=1, block_size=K)
    folder = Path(shutil.copytree(good, tmp_path_factory.mktemp("overflow") / request.param))
    weights = load_file(folder / "model.safetensors")
    for name, value in OVERFLOWS[request.param].items():
        weights[name] = torch.full_like(weights[name], value)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_greedy_output_and_counters_survive_an_overflowing_drafter(
    drafter: Path,
    target: Path,
    baseline: list[list[int]],
    tmp_path: Path,
    threshold: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every confidence reads 0: without a threshold every draft is verified (confidence sums 0), with one
    none is (every round unverified); the tokens are the target's alone; one log line."""
    log = tmp_path / "spec.jsonl"
    spec = DrafterSpec("dspark", K, drafter, confidence_threshold=threshold)
    core = make_core(target, speculative=spec, spec_log=log)
    with caplog.at_level(logging.WARNING, logger="openinfer.engine"):
        outputs, _ = run(core, spec_prompts())  # checks the counter invariants on every snapshot
    assert outputs == baseline
    assert core.spec is not None
    counters = core.spec.counters
    assert counters == spec_log_counters(read_spec_log(log), K)
    assert counters.confidence_micros_per_pos == [0] * K
    if threshold:
        assert counters.num_drafts == 0 and counters.num_unverified_draft_tokens > 0
    else:
        assert counters.num_drafts > 0 and counters.num_unverified_draft_tokens == 0
    lines = [r.getMessage() for r in caplog.records if "produced NaN or infinite values" in r.message]
    assert len(lines) == 1 and str(drafter) in lines[0], lines


def test_adaptive_verification_verifies_none_of_its_drafts(
    drafter: Path, target: Path, baseline: list[list[int]], tmp_path: Path
) -> None:
    """Survival 0 from the first draft: adaptive verification's budget takes none of them."""
    log = tmp_path / "spec.jsonl"
    spec = DrafterSpec("dspark", K, drafter, adaptive_verification=True)
    core = make_core(target, speculative=spec, spec_log=log)
    outputs, _ = run(core, spec_prompts())
    assert outputs == baseline
    assert core.spec is not None
    counters = core.spec.counters
    assert counters == spec_log_counters(read_spec_log(log), K)
    assert counters.num_drafts == 0 and counters.num_unverified_draft_tokens > 0


def test_sampled_requests_draw_real_drafts(drafter: Path, target: Path, tmp_path: Path) -> None:
    """At temperature 1 the drafts are drawn from finite distributions, which rejection sampling verifies:
    every request ends by its length, tokens in the vocabulary, counters equal to the spec log."""
    log = tmp_path / "spec.jsonl"
    core = make_core(target, speculative=DrafterSpec("dspark", K, drafter), spec_log=log)
    outputs, finishes = generate_with(core, spec_prompts(), temperature=1.0, max_tokens=20)
    assert finishes == ["length"] * len(outputs)
    assert all(0 <= t < 512 for tokens in outputs for t in tokens)
    assert core.spec is not None
    assert core.spec.counters == spec_log_counters(read_spec_log(log), K)
    assert core.spec.counters.num_drafts > 0


def test_a_slot_of_non_finite_logits_draws_from_a_distribution() -> None:
    """NaN reads as 0 and +-inf as +-LOGIT_LIMIT: q is a distribution at the lowest temperature too, and the
    greedy row takes the argmax of the logits as they are (a valid id)."""
    logits = torch.tensor(
        [[float("nan"), 1.0, float("inf"), 2.0], [float("nan")] * 4, [float("-inf"), 3e38, -3e38, 0.0]]
    )
    assert finite_logits(logits[2]).tolist() == [-LOGIT_LIMIT, LOGIT_LIMIT, -LOGIT_LIMIT, 0.0]
    sampling = DraftSampling(torch.tensor([1e-5, 1.0, 0.0]), torch.full((3, 1), 0.5))
    drafts, q = draw_slot(logits, sampling, 0)
    assert torch.isfinite(q).all() and torch.allclose(q.sum(dim=-1), torch.ones(3))
    # row 0: +inf (LOGIT_LIMIT) wins at T=1e-5; row 1: uniform, the draw at 0.5 is token 2; row 2: greedy
    assert drafts.tolist() == [2, 2, 1]
