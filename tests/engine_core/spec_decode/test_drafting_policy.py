"""The drafting policy of adaptive verification: it speculates, then measures plain decoding, then runs the
faster mode and explores the other in short windows; a step that switches mode or holds prefill moves no
rate. In an engine where plain decoding is (made) far faster, proposing stops but for the exploring windows,
the drafter's context is still written (its exploring rounds accept drafts), and the tokens and counters
are those of a run without speculation and of the spec log."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer.engine_core.builtin_model import builtin_drafter_folder, builtin_target_folder
from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.spec_decode.drafting_policy import EXPLORE_EVERY, EXPLORE_STEPS, DraftingPolicy
from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core
from openinfer.engine_core.testing.spec_logs import read_spec_log, spec_log_counters
from openinfer.protocol import EngineCoreRequest, SamplingParams


def test_modes_in_order_then_the_faster_with_exploring_windows() -> None:
    policy = DraftingPolicy()
    assert [policy.choose() for _ in range(3)] == [True] * 3  # speculating is unmeasured
    policy.observe(proposed=True, verified=True, tokens=40, seconds=0.010)  # 4,000 tok/s
    assert policy.choose() is False  # plain decoding is unmeasured
    policy.observe(proposed=False, verified=False, tokens=8, seconds=0.004)  # 2,000 tok/s
    chosen = [policy.choose() for _ in range(8 * EXPLORE_EVERY)]
    # steps 5..260: speculating, but plain in windows of EXPLORE_STEPS steps, the first at EXPLORE_EVERY
    # (32), each next one twice as far on, since each leaves speculating the faster: 32, 96, 224
    windows = [step for step, mode in enumerate(chosen, start=5) if not mode]
    starts = [EXPLORE_EVERY, 3 * EXPLORE_EVERY, 7 * EXPLORE_EVERY]
    assert windows == [start + i for start in starts for i in range(EXPLORE_STEPS)]


def test_a_window_that_changes_the_faster_mode_brings_the_next_one_closer() -> None:
    """After windows that confirmed speculating (gaps 32, then 64), plain decoding measures faster in the
    window at step 96: the engine decodes plainly (speculating in the rest of that window, now the mode it
    explores) and explores speculating again 32 steps after that window began, not 128."""
    policy = DraftingPolicy()
    policy.observe(proposed=True, verified=True, tokens=40, seconds=0.010)  # 4,000 tok/s
    policy.choose()
    policy.observe(proposed=False, verified=False, tokens=8, seconds=0.004)  # 2,000 tok/s
    while policy.steps < 3 * EXPLORE_EVERY:  # windows at 32 and 96 begin with speculating the faster
        policy.choose()
    assert policy.gap == 2 * EXPLORE_EVERY
    policy.rates[False] = 8000.0  # what the window's first plain step measured
    chosen = [policy.choose() for _ in range(2 * EXPLORE_EVERY)]  # steps 97..160
    proposing = [step for step, mode in enumerate(chosen, start=3 * EXPLORE_EVERY + 1) if mode]
    assert proposing == [97, 98, 128, 129, 130]
    assert policy.gap == 2 * EXPLORE_EVERY  # the window at 128 confirmed plain: the next at 192


def test_only_steps_in_one_mode_count() -> None:
    """A switching step (verified drafts, proposed none, or the reverse) moves nothing; a mode's first ten
    steps are averaged evenly, each later one moves its rate a tenth of the way (a moving average)."""
    policy = DraftingPolicy()
    policy.observe(proposed=False, verified=True, tokens=30, seconds=0.01)
    policy.observe(proposed=True, verified=False, tokens=1, seconds=0.01)
    assert policy.rates == {True: None, False: None}
    policy.observe(proposed=True, verified=True, tokens=30, seconds=0.01)
    policy.observe(proposed=True, verified=True, tokens=10, seconds=0.01)
    assert policy.rates[True] == pytest.approx(2000)  # (3,000 + 1,000) / 2
    for _ in range(8):
        policy.observe(proposed=True, verified=True, tokens=20, seconds=0.01)
    assert policy.rates[True] == pytest.approx(2000) and policy.counts[True] == 10
    policy.observe(proposed=True, verified=True, tokens=30, seconds=0.01)
    assert policy.rates[True] == pytest.approx(2000 + 0.1 * (3000 - 2000))
    assert policy.rates[False] is None


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
    core.spec.drafting.rates = {True: 1.0, False: 1e6}
    monkeypatch.setattr(core.spec.drafting, "observe", lambda *args, **kwargs: None)  # the rates stay
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
        core.spec.drafting.rates = {True: 1.0, False: 1e6}  # plain decoding pays: proposing pauses
        monkeypatch.setattr(core.spec.drafting, "observe", lambda *args, **kwargs: None)
        for i, prompt in enumerate(prompts):
            params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
            core.add_request(EngineCoreRequest(str(i), prompt, params))
    assert eager.spec is not None
    eager_write = eager.spec._write_context
    monkeypatch.setattr(eager.spec, "_write_context", lambda updates, now: eager_write(updates, True))
    assert deferred.spec is not None and eager.spec is not None
    while deferred.spec.drafting.steps < EXPLORE_EVERY - 1:  # up to the last paused step before a window
        deferred.step()
        eager.step()
    assert deferred.spec._pending_rows > 0  # the paused steps' positions, none written yet
    cache = deferred.spec.drafter.context_caches  # type: ignore[attr-defined]
    assert not torch.equal(cache, eager.spec.drafter.context_caches)  # type: ignore[attr-defined]
    deferred.step()  # the window's first step: it proposes, so everything kept is written first
    eager.step()
    assert deferred.spec._pending_rows == 0 and deferred.spec._proposed
    torch.testing.assert_close(cache, eager.spec.drafter.context_caches, atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]


def test_the_mode_in_use_gives_way_only_to_one_clearly_faster() -> None:
    """Speculating runs; plain decoding measured 2 % faster does not take over (noise, and a switch costs a
    step), 10 % faster does; then speculating 2 % faster than plain does not take it back."""
    policy = DraftingPolicy()
    policy.observe(proposed=True, verified=True, tokens=40, seconds=0.010)  # 4,000 tok/s
    policy.choose()
    policy.observe(proposed=False, verified=False, tokens=8, seconds=0.004)  # 2,000 tok/s
    assert policy.choose() is True
    policy.rates[False] = 4080.0
    assert policy.choose() is True
    policy.rates[False] = 4400.0
    assert policy.choose() is False
    policy.rates[True] = 4488.0
    assert policy.choose() is False
