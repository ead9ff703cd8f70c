"""Adaptive verification: the step's draft budget is the best of every allocation, the step costs interpolate
what was measured, and an engine that verifies only what pays stays lossless with exact counters."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.spec_decode.adaptive import (
    EXPLORE_EVERY,
    AttentionCosts,
    StepCosts,
    confidence_survival,
    counter_survival,
    verify_lengths,
)
from openinfer.engine_core.testing.engine_cores import make_core, spec_prompts
from openinfer.engine_core.testing.spec_logs import read_spec_log, spec_log_counters
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from openinfer.protocol import SpecDecodeCounters
from tests.engine_core.spec_decode.spec_runs import K, run


def rate(lengths: tuple[int, ...], survival: list[list[float]], costs: StepCosts, base: int) -> float:
    """Expected tokens per second of verifying each round's first lengths[r] drafts."""
    expected = base + sum(sum(row[:n]) for row, n in zip(survival, lengths, strict=True))
    return expected / costs.seconds(base + sum(lengths))


@pytest.mark.parametrize("seed", range(40))
def test_the_budget_is_the_best_of_every_allocation(seed: int) -> None:
    """Random survivals (non-increasing per round) and cost curves: no way of choosing each round's
    verified prefix gives more expected tokens per second than verify_lengths' (all enumerated)."""
    rng = random.Random(seed)
    survival = []
    for _ in range(rng.randint(1, 3)):
        row = sorted((rng.random() for _ in range(rng.randint(1, 4))), reverse=True)
        survival.append(row)
    sizes = sorted(rng.sample(range(1, 20), 3))
    costs = StepCosts({n: 0.01 + rng.random() * 0.002 * n ** rng.choice((0.5, 1.0, 1.5)) for n in sizes})
    base = rng.randint(1, 4)
    chosen = verify_lengths(survival, costs, base)
    assert all(0 <= n <= len(row) for n, row in zip(chosen, survival, strict=True))
    best = max(rate(lengths, survival, costs, base) for lengths in
               itertools.product(*(range(len(row) + 1) for row in survival)))  # fmt: skip
    assert rate(tuple(chosen), survival, costs, base) == pytest.approx(best, rel=1e-12)


def test_flat_and_steep_costs() -> None:
    """A step that costs the same whatever it verifies verifies every draft; one whose every draft token
    costs more than the whole step yields verifies none, however sure the drafts; in between, the best."""
    survival = [[0.9, 0.5, 0.1], [0.99]]
    assert verify_lengths(survival, StepCosts({1: 1.0, 100: 1.0}), 2) == [3, 1]
    assert verify_lengths(survival, StepCosts({1: 1.0, 2: 3.0}), 2) == [0, 0]
    # 2 ms for the base 2 tokens, 0.5 ms per draft token: tokens per ms 1, 1.196, 1.297 (the best: the
    # first draft of each round), 1.254, 1.12
    assert verify_lengths(survival, StepCosts({2: 0.002, 10: 0.006}), 2) == [1, 1]
    # A step that jumps in cost at 3 tokens and stays flat to 5 (a GPU's tile): the rate dips at 2 drafts
    # (2.8 / 1.5 < 1.9 / 1) and rises past it, so the search does not stop at the first dip.
    assert verify_lengths([[0.9] * 4], StepCosts({1: 1.0, 2: 1.0, 3: 1.5, 5: 1.5}), 1) == [4]


def test_step_costs_interpolate_and_learn() -> None:
    """The forward's measured points, linear in between and past the last, never cheaper for more tokens;
    each observed step moves the overhead a tenth of the way to what the forward does not explain."""
    costs = StepCosts({1: 0.010, 4: 0.010, 8: 0.020})
    assert costs.seconds(1) == costs.seconds(3) == 0.010
    assert costs.seconds(6) == pytest.approx(0.015) and costs.seconds(12) == pytest.approx(0.030)
    assert StepCosts({1: 0.02, 2: 0.01}).seconds(2) == 0.02
    costs.observe(8, 0.030)  # 10 ms more than the forward: the overhead goes from 0 to 1 ms
    assert costs.overhead == pytest.approx(0.001) and costs.seconds(6) == pytest.approx(0.016)
    costs.observe(6, 0.025)  # 10 ms over the forward's 15: 1 + 0.1 * (10 - 1) ms
    assert costs.overhead == pytest.approx(0.0019)
    costs.observe(1, 0.001)  # faster than the forward's estimate: the overhead shrinks, never below 0
    assert costs.overhead == pytest.approx(0.0019 + 0.1 * (-0.009 - 0.0019))
    for _ in range(100):
        costs.observe(1, 0.001)
    assert costs.overhead == 0.0


def rate_at(
    lengths: tuple[int, ...], survival: list[list[float]], costs: StepCosts, contexts: list[int]
) -> float:
    """Expected tokens per second of verifying each round's first lengths[r] drafts, each round r with
    1 + lengths[r] queries over contexts[r] tokens (base: one token a round)."""
    base = len(survival)
    expected = base + sum(sum(row[:n]) for row, n in zip(survival, lengths, strict=True))
    attention = sum(costs.attention_seconds(1 + n, c) for n, c in zip(lengths, contexts, strict=True))
    return expected / (costs.seconds(base + sum(lengths)) + attention)


@pytest.mark.parametrize("seed", range(20))
def test_context_priced_budget_is_the_best_of_every_allocation(seed: int) -> None:
    """With each round's attention priced by its context (rounds at 10, 500 and 4,000 tokens), no
    allocation beats verify_lengths' (all enumerated)."""
    rng = random.Random(seed)
    survival = [sorted((rng.random() for _ in range(rng.randint(1, 4))), reverse=True) for _ in range(3)]
    costs = StepCosts(
        {n: 0.002 + 0.0002 * n for n in (1, 2, 4, 8, 16)},
        attention=AttentionCosts(64, rng.random() * 2e-7, rng.random() * 2e-7),
    )
    contexts = [rng.choice((10, 500, 4000)) for _ in survival]
    chosen = verify_lengths(survival, costs, len(survival), contexts)
    best = max(
        rate_at(c, survival, costs, contexts)
        for c in itertools.product(*(range(len(r) + 1) for r in survival))
    )
    assert rate_at(tuple(chosen), survival, costs, contexts) == pytest.approx(best)


def test_attention_by_context() -> None:
    """Past the context the forward was measured at, a request's attention costs its keys once and each
    query's pairs; within it, nothing; at 2,000 tokens of context a verification of 8 drafts that costs
    3.7x a decode (as measured on the CPU) gets fewer drafts verified than at 100 tokens; an observed step
    leaves the attention's estimate out of the overhead."""
    attention = AttentionCosts(64, per_key=1e-6, per_pair=0.5e-6)
    assert attention.seconds(1, 64) == 0.0 and attention.seconds(1, 10) == 0.0
    assert attention.seconds(8, 1064) == pytest.approx(1000 * (1e-6 + 8 * 0.5e-6))
    flat = {n: 0.010 for n in (1, 2, 4, 8, 16)}  # the forward: 10 ms whatever the tokens
    # per_pair such that 8 queries at 2,000 tokens cost 3.7x one query's 10 ms step: (3.7 - 1) * 10 ms
    costs = StepCosts(flat, attention=AttentionCosts(64, 0.0, 0.027 / (7 * 1936)))
    survival = [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]]
    assert verify_lengths(survival, costs, 1, [100]) == [7]
    assert verify_lengths(survival, costs, 1, [2000]) < [7]
    costs.observe(1, 0.020, attention=0.004)  # 20 ms: 10 forward, 4 attention, 6 left to the overhead
    assert costs.overhead == pytest.approx(0.0006)
    with pytest.raises(ValueError, match="never negative"):
        StepCosts(flat, attention=AttentionCosts(0, -1.0, 0.0))


def test_survival_estimates() -> None:
    assert confidence_survival([0.5, 0.8, 1.0]) == pytest.approx([0.5, 0.4, 0.4])
    engine = SpecDecodeCounters.zero(3)
    for accepted in (2, 2, 0, 3):
        engine.observe_draft(3, accepted)
    # engine: accepted per pos [3, 3, 1] of [4, 4, 4] verified: (3+1)/6, (3+1)/6, (1+1)/6
    assert counter_survival(engine, None, 3) == pytest.approx([4 / 6, 4 / 6, 2 / 6])
    request = SpecDecodeCounters.zero(3)
    request.observe_draft(2, 0)  # this request: nothing accepted at 0 and 1 (of 1 verified), 2 unseen
    blended = [(0 + 4 * 4 / 6) / 5, (0 + 4 * 4 / 6) / 5, 2 / 6]
    assert counter_survival(engine, request, 3) == pytest.approx(blended)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target") / "t", seed=5, overrides=SMALL_TEXT_QWEN3)


@pytest.mark.parametrize(
    ("costs", "verified"),
    [(StepCosts({1: 0.01, 4096: 0.01}), "all"), (StepCosts({1: 0.01, 2: 1.0}), "none"), (None, "measured")],
    ids=["flat", "steep", "measured"],
)
def test_engine_verifies_what_pays(
    target: Path, tmp_path: Path, costs: StepCosts | None, verified: str
) -> None:
    """n-gram drafting with adaptive verification: the engine measures its step costs at start; with
    verification free every proposal is verified, with it dearer than any draft none is but the rounds kept
    for learning (every 16th left out); either way, and with the costs measured, the tokens are those of no
    speculation and the counters those of the spec log."""
    baseline = run(make_core(target), spec_prompts())[0]
    log = tmp_path / "spec.jsonl"
    spec = DrafterSpec("ngram", K, adaptive_verification=True)
    core = make_core(target, speculative=spec, spec_log=log)
    assert core.step_costs is not None and core.spec is not None
    assert core.step_costs.attention is not None  # priced: the tiny model's cache holds a long context
    if costs is not None:
        core.spec.step_costs = costs  # a fixed curve the engine's own measurements do not move
        core.spec.drafting = None  # every step proposes: what is verified is the curve's choice alone
    outputs, _ = run(core, spec_prompts())
    assert outputs == baseline
    lines = read_spec_log(log)
    counters = core.spec.counters
    assert counters == spec_log_counters(lines, K) and lines
    if verified == "all":
        assert counters.num_unverified_draft_tokens == 0 and counters.num_accepted_tokens > 0
    elif verified == "none":  # but every 16th round, verified whole to keep the estimates learning
        drafts = [x for x in lines if x["num_draft_tokens"]]
        assert len(lines) >= 32 and len(drafts) == len(lines) // EXPLORE_EVERY
        assert all(x["num_draft_tokens"] == x["num_proposed_tokens"] for x in drafts)


def test_adaptive_needs_costs_measured_at_start(target: Path) -> None:
    core = make_core(target)
    with pytest.raises(ValueError, match="start the engine with --enable-adaptive-verification"):
        core.load_drafter(DrafterSpec("ngram", K, adaptive_verification=True))
