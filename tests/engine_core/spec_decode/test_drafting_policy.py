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
    BatchMode,
    DraftingPolicy,
    bucket_of,
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
    """The built-in DFlash pair with adaptive verification, its policy holding plain decoding as what pays at
    batches of 1 and of 2-3 (windows 16 steps apart) and measuring nothing: it proposes in the exploring
    windows and only there, those rounds still accept drafts (the context was written meanwhile), and the
    output is that of no speculation, its counters the spec log's."""
    prompts = [list(range(3, 40)), list(range(100, 117))]
    baseline = generate_greedy(make_core(builtin_target_folder()), prompts, 120)
    log = tmp_path / "spec.jsonl"
    spec = DrafterSpec("dflash", 7, builtin_drafter_folder("dflash"), adaptive_verification=True)
    core = make_core(builtin_target_folder(), speculative=spec, spec_log=log)
    assert core.spec is not None and core.spec.drafting is not None
    policy = core.spec.drafting
    policy.learned = {bucket_of(b): BatchMode(speculating=False, gap=16) for b in (1, 2)}
    monkeypatch.setattr(policy, "observe", lambda *args, **kwargs: None)  # nothing measured
    chosen: list[tuple[bool, bool]] = []  # (proposes, in a window) per step
    choose = policy.choose

    def recorded(batch: int = 1) -> bool:
        chosen.append((choose(batch), policy.exploring))
        return chosen[-1][0]

    monkeypatch.setattr(policy, "choose", recorded)
    assert generate_greedy(core, prompts, 120) == baseline
    lines = read_spec_log(log)
    counters = core.spec.counters
    assert counters == spec_log_counters(lines, 7)
    assert all(proposes == exploring for proposes, exploring in chosen)
    assert 0 < sum(proposes for proposes, _ in chosen) < len(chosen) / 2 and len(lines) > 0
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
        # plain decoding at batches of 2-3, windows FIRST_WINDOW steps apart: proposing pauses
        core.spec.drafting.learned = {bucket_of(2): BatchMode(speculating=False, gap=FIRST_WINDOW)}
        monkeypatch.setattr(core.spec.drafting, "observe", lambda *args, **kwargs: None)
        for i, prompt in enumerate(prompts):
            params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
            core.add_request(EngineCoreRequest(str(i), prompt, params))
    assert eager.spec is not None
    eager_write = eager.spec.pending_context.write
    monkeypatch.setattr(eager.spec.pending_context, "write", lambda rows, now: eager_write(rows, True))
    assert deferred.spec is not None and eager.spec is not None
    while deferred.spec.drafting.steps < FIRST_WINDOW - 1:  # up to the last paused step before a window
        deferred.step()
        eager.step()
    assert deferred.spec.pending_context.num_rows > 0  # the paused steps' positions, none written yet
    cache = deferred.spec.drafter.context_caches  # type: ignore[attr-defined]
    assert not torch.equal(cache, eager.spec.drafter.context_caches)  # type: ignore[attr-defined]
    deferred.step()  # the window's first step: it proposes, so everything kept is written first
    eager.step()
    assert deferred.spec.pending_context.num_rows == 0 and deferred.spec._proposed
    torch.testing.assert_close(cache, eager.spec.drafter.context_caches, atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]


def run_at(policy: DraftingPolicy, batch: int, steps: int, spec_rate: float, plain_rate: float) -> list[bool]:
    """``steps`` steps of ``batch`` requests, each mode measured at its rate (tok/s): the modes chosen."""
    chosen = []
    for _ in range(steps):
        chosen.append(policy.choose(batch))
        rate = spec_rate if chosen[-1] else plain_rate
        policy.observe(proposed=chosen[-1], verified=chosen[-1], tokens=batch, seconds=batch / rate)
    return chosen


def test_each_batch_bucket_keeps_its_mode() -> None:
    """Speculating pays at batch 1 and loses at batch 16: the first batch of 16 speculates (a bucket never
    tested, above one that speculates) until its window at step 8 finds plain decoding faster (a window of
    speculating at step 40 ends after its 2 first measured steps, at a quarter of the rate); back at batch
    1 the engine speculates from the first step, at 16 decodes plainly from the first step, each bucket's
    next window as far in as its windows had grown apart (160 steps: the budget's for a mode at half the
    rate); a bucket never tested above a plain one (32 requests) starts plainly, one below it speculating."""
    policy = DraftingPolicy()
    assert all(run_at(policy, 1, 100, spec_rate=4000, plain_rate=2000)[: FIRST_WINDOW - 1])
    first_16 = run_at(policy, 16, 100, spec_rate=1000, plain_rate=4000)
    proposing = [step for step, proposes in enumerate(first_16, start=1) if proposes]
    # speculating up to the window at 8, which switches; the next, 32 steps after it, ends after 5 steps
    assert proposing == [
        *range(1, FIRST_WINDOW),
        *range(FIRST_WINDOW + EXPLORE_EVERY, FIRST_WINDOW + EXPLORE_EVERY + SETTLE_STEPS + EARLY_END_STEPS),
    ]
    assert all(run_at(policy, 1, 150, spec_rate=4000, plain_rate=2000))  # its next window: step 160
    assert not any(run_at(policy, 16, 150, spec_rate=1000, plain_rate=4000))
    assert policy.learned[bucket_of(1)].speculating and not policy.describe().startswith("speculating")
    assert not any(run_at(policy, 32, FIRST_WINDOW - 1, spec_rate=500, plain_rate=4000))
    assert all(run_at(policy, 4, FIRST_WINDOW - 1, spec_rate=4000, plain_rate=2000))


def test_a_bucket_no_window_tested_is_not_learned() -> None:
    """A short stint at a batch (a load ramping up, 2-3 requests for 5 steps) leaves no mode behind: only a
    window's measurement makes one."""
    policy = DraftingPolicy()
    run_at(policy, 1, 20, spec_rate=4000, plain_rate=2000)
    run_at(policy, 2, 5, spec_rate=100, plain_rate=4000)
    run_at(policy, 1, 5, spec_rate=4000, plain_rate=2000)
    assert set(policy.learned) == {bucket_of(1)} and bucket_of(2) == bucket_of(3) == 2


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
