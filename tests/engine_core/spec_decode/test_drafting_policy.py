"""The drafting policy of adaptive verification: it speculates, measures plain decoding in a window, runs the
faster mode and explores the other in windows ever further apart while they keep the mode, switching only to
a mode measured clearly faster side by side; a step that switches mode or holds prefill moves no rate. In an
engine where plain decoding is (made) far faster, proposing stops but for the windows, the drafter's context
is kept and written before the next proposal (its exploring rounds accept drafts), and the tokens and
counters are those of a run without speculation and of the spec log."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer.engine_core.builtin_model import builtin_drafter_folder, builtin_target_folder
from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.spec_decode.drafting_policy import (
    EARLY_END_STEPS,
    EXPLORE_EVERY,
    EXPLORE_STEPS,
    FIRST_WINDOW,
    SETTLE_STEPS,
    DraftingPolicy,
)
from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core
from openinfer.engine_core.testing.spec_logs import read_spec_log, spec_log_counters
from openinfer.protocol import EngineCoreRequest, SamplingParams


def test_speculates_explores_plain_in_windows_and_keeps_the_faster() -> None:
    """Speculating runs first; windows of plain decoding come at FIRST_WINDOW (8), then, plain decoding
    measured at half the rate, far enough on that a window's 8 steps (costing 8 more) are EXPLORE_BUDGET
    (5 %) of the time: 160 steps, then twice that: 8, 168, 488."""
    policy = DraftingPolicy()
    chosen = []
    for _ in range(500):
        chosen.append(policy.choose())
        if chosen[-1]:
            policy.observe(proposed=True, verified=True, tokens=40, seconds=0.010)  # 4,000 tok/s
        else:
            policy.observe(proposed=False, verified=False, tokens=8, seconds=0.004)  # 2,000 tok/s
    windows = [step for step, proposing in enumerate(chosen, start=1) if not proposing]
    starts = [FIRST_WINDOW, FIRST_WINDOW + 160, FIRST_WINDOW + 160 + 320]
    assert windows == [start + i for start in starts for i in range(EXPLORE_STEPS)]
    assert policy.speculating and policy.rate == pytest.approx(4000)


def test_a_window_that_measures_the_other_mode_faster_switches() -> None:
    """Plain decoding measured 2x faster in the first window (its first SETTLE_STEPS steps, slow as they
    may be, not measured): the engine decodes plainly from the window's end, its rate the window's, and
    explores speculating EXPLORE_EVERY steps after that window began."""
    policy = DraftingPolicy()
    for _ in range(FIRST_WINDOW - 1):
        policy.choose()
        policy.observe(proposed=True, verified=True, tokens=20, seconds=0.010)  # 2,000 tok/s
    policy.choose()  # the window's first step: it verifies the last drafts, proposes none (no rate)
    policy.observe(proposed=False, verified=True, tokens=30, seconds=0.010)
    for step in range(1, EXPLORE_STEPS):
        assert policy.choose() is False
        tokens = 5 if step < SETTLE_STEPS else (36, 44)[step % 2]  # settling: 500 tok/s; then ~4,000
        policy.observe(proposed=False, verified=False, tokens=tokens, seconds=0.010)
    end = FIRST_WINDOW + EXPLORE_STEPS
    chosen = [policy.choose() for _ in range(40)]  # from the window's end on
    assert not policy.speculating and policy.rate == pytest.approx(4000, rel=0.03)
    proposing = [step for step, mode in enumerate(chosen, start=end) if mode]
    next_start = FIRST_WINDOW + EXPLORE_EVERY  # 40
    assert proposing == [next_start + i for i in range(EXPLORE_STEPS)]


@pytest.mark.parametrize(("faster_by", "switches"), [(0.02, False), (0.10, True)])
def test_the_mode_in_use_gives_way_only_to_one_clearly_faster(faster_by: float, switches: bool) -> None:
    """A window measuring plain decoding 2 % faster keeps speculating (noise, and a switch costs a step that
    measures neither mode); 10 % faster switches."""
    policy = DraftingPolicy()
    for _ in range(FIRST_WINDOW - 1):
        policy.choose()
        policy.observe(proposed=True, verified=True, tokens=40, seconds=0.010)  # 4,000 tok/s
    for _ in range(EXPLORE_STEPS):
        policy.choose()
        policy.observe(proposed=False, verified=False, tokens=40, seconds=0.010 / (1 + faster_by))
    policy.choose()
    assert policy.speculating is not switches


def test_only_steps_in_one_mode_count() -> None:
    """A switching step (verified drafts, proposed none, or the reverse) moves nothing; the mode in use's
    first ten steps are averaged evenly, each later one moves its rate a tenth of the way; the other mode's
    steps go to the window once it has settled."""
    policy = DraftingPolicy()
    policy.observe(proposed=False, verified=True, tokens=30, seconds=0.01)
    policy.observe(proposed=True, verified=False, tokens=1, seconds=0.01)
    assert policy.rate is None and policy.explored == []
    policy.observe(proposed=True, verified=True, tokens=30, seconds=0.01)
    policy.observe(proposed=True, verified=True, tokens=10, seconds=0.01)
    assert policy.rate == pytest.approx(2000)  # (3,000 + 1,000) / 2
    for _ in range(8):
        policy.observe(proposed=True, verified=True, tokens=20, seconds=0.01)
    assert policy.rate == pytest.approx(2000) and policy.count == 10
    policy.observe(proposed=True, verified=True, tokens=30, seconds=0.01)
    assert policy.rate == pytest.approx(2000 + 0.1 * (3000 - 2000))
    policy.observe(proposed=False, verified=False, tokens=5, seconds=0.01)  # before any window settles
    assert policy.explored == []
    policy.steps = policy.window + SETTLE_STEPS  # a window's measured step
    policy.observe(proposed=False, verified=False, tokens=5, seconds=0.01)
    assert policy.explored == [500.0]


def test_an_engine_stops_proposing_where_it_does_not_pay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in DFlash pair with adaptive verification, its policy's rates fixed with plain decoding a
    million times faster: it proposes only in the exploring windows, those rounds still accept drafts (the
    context was written meanwhile), and the output is that of no speculation, its counters the spec log's."""
    prompts = [list(range(3, 40)), list(range(100, 117))]
    baseline = generate_greedy(make_core(builtin_target_folder()), prompts, 120)
    log = tmp_path / "spec.jsonl"
    spec = DrafterSpec("dflash", 7, builtin_drafter_folder("dflash"), adaptive_verification=True)
    core = make_core(builtin_target_folder(), speculative=spec, spec_log=log)
    assert core.spec is not None and core.spec.drafting is not None
    core.spec.drafting.speculating, core.spec.drafting.rate = False, 1e6  # plain decoding, far faster
    monkeypatch.setattr(core.spec.drafting, "observe", lambda *args, **kwargs: None)  # nothing measured
    assert generate_greedy(core, prompts, 120) == baseline
    lines = read_spec_log(log)
    counters = core.spec.counters
    assert counters == spec_log_counters(lines, 7)
    steps = core.spec.drafting.steps
    # at most two proposers per exploring step, one round each; the windows' first steps propose
    assert 0 < len(lines) <= 2 * EXPLORE_STEPS * (steps // EXPLORE_EVERY + 1)
    assert counters.num_accepted_tokens > 0


def test_paused_steps_write_their_context_before_the_next_proposal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps that propose nothing keep their drafter-context updates (no write per step), and the next step
    that proposes writes them all first: its context cache then equals, position for position, that of an
    engine writing every step's context at once (the same steps, the same decisions)."""
    prompts = [list(range(3, 40)), list(range(100, 117))]
    spec = DrafterSpec("dflash", 7, builtin_drafter_folder("dflash"), adaptive_verification=True)
    deferred, eager = (make_core(builtin_target_folder(), speculative=spec) for _ in range(2))
    for core in (deferred, eager):
        assert core.spec is not None and core.spec.drafting is not None
        core.spec.drafting.speculating, core.spec.drafting.rate = False, 1e6  # proposing pauses
        monkeypatch.setattr(core.spec.drafting, "observe", lambda *args, **kwargs: None)
        for i, prompt in enumerate(prompts):
            params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
            core.add_request(EngineCoreRequest(str(i), prompt, params))
    assert eager.spec is not None
    eager_write = eager.spec._write_context
    monkeypatch.setattr(eager.spec, "_write_context", lambda updates, now: eager_write(updates, True))
    assert deferred.spec is not None and eager.spec is not None
    while deferred.spec.drafting.steps < FIRST_WINDOW - 1:  # up to the last paused step before a window
        deferred.step()
        eager.step()
    assert deferred.spec._pending_rows > 0  # the paused steps' positions, none written yet
    cache = deferred.spec.drafter.context_caches  # type: ignore[attr-defined]
    assert not torch.equal(cache, eager.spec.drafter.context_caches)  # type: ignore[attr-defined]
    deferred.step()  # the window's first step: it proposes, so everything kept is written first
    eager.step()
    assert deferred.spec._pending_rows == 0 and deferred.spec._proposed
    torch.testing.assert_close(cache, eager.spec.drafter.context_caches, atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]


def test_a_batch_twice_or_half_as_big_brings_the_next_window_closer() -> None:
    """Windows far apart at batch 1 (speculating confirmed at 8, 168, 488): 16 requests at step 300 bring the
    next window within EXPLORE_EVERY steps, the gap back to EXPLORE_EVERY; more steps of the same batch, or a
    later change, bring it no closer."""
    policy = DraftingPolicy()
    while policy.steps < 300:
        policy.choose()
        if policy.exploring:
            policy.observe(proposed=False, verified=False, tokens=1, seconds=0.004, batch=1)  # 250 tok/s
        else:
            policy.observe(proposed=True, verified=True, tokens=4, seconds=0.008, batch=1)  # 500 tok/s
    assert policy.window == FIRST_WINDOW + 160 + 320  # 488: gaps of 160 (the budget's), then 320
    policy.observe(proposed=True, verified=True, tokens=6, seconds=0.008, batch=1)
    policy.observe(proposed=True, verified=True, tokens=6, seconds=0.008, batch=1)
    assert policy.window == 488
    policy.observe(proposed=True, verified=True, tokens=60, seconds=0.030, batch=16)
    assert policy.window == 300 + EXPLORE_EVERY and policy.gap == EXPLORE_EVERY
    policy.observe(proposed=True, verified=True, tokens=60, seconds=0.030, batch=4)  # 16 -> 4: no closer
    assert policy.window == 300 + EXPLORE_EVERY


@pytest.mark.parametrize(
    ("plain_tokens", "plain_seconds", "window_steps", "gap"),
    [
        (1, 0.001, SETTLE_STEPS + EARLY_END_STEPS, 350),  # 1,000 against 4,500 tok/s: 5 steps cost 17.5 more
        (3, 0.001, EXPLORE_STEPS, 80),  # two thirds: 8 steps cost 4 more
        (44, 0.010, EXPLORE_STEPS, 2 * EXPLORE_EVERY),  # within noise: twice as far
    ],
)
def test_a_window_of_a_far_slower_mode_ends_early_and_the_next_one_is_as_far_as_it_cost(
    plain_tokens: int, plain_seconds: float, window_steps: int, gap: int
) -> None:
    """Plain decoding measured at under half speculating's rate ends its window after EARLY_END_STEPS
    measured steps; the next window comes far enough on that windows cost EXPLORE_BUDGET of the time (a
    window of n steps at r' against r costs n (r / r' - 1) steps more), and at least twice as far."""
    policy = DraftingPolicy()
    explored = 0
    while policy.steps < FIRST_WINDOW + EXPLORE_STEPS:
        policy.choose()
        if policy.exploring:
            explored += 1
            policy.observe(proposed=False, verified=False, tokens=plain_tokens, seconds=plain_seconds)
        else:
            policy.observe(proposed=True, verified=True, tokens=9, seconds=0.002)  # 4,500 tok/s
    assert explored == window_steps and policy.speculating
    assert policy.gap == gap and policy.window == FIRST_WINDOW + gap
