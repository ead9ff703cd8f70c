"""Speculative decoding in the engine core: lossless at temperature 0, counted exactly (docs/design.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.models.dflash_config import AnchorLayout
from openinfer.engine_core.spec_decode.ngram import ngram_propose
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.engine_cores import CheckedSteps, make_core, spec_prompts
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.spec_logs import read_spec_log as read_log
from openinfer.engine_core.testing.spec_logs import spec_log_counters
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3 as SMALL
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.fake_model_runner import FIRST_CYCLE_TOKEN
from openinfer.kernels.verification import accepted_prefix_length
from openinfer.protocol import EngineCoreRequest, SamplingParams, SpecDecodeCounters
from tests.engine_core.spec_decode.spec_runs import MAX_TOKENS, K, run


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target") / "t", seed=5, overrides=SMALL)


@pytest.fixture(scope="module")
def baseline(target: Path) -> list[list[int]]:
    return run(make_core(target), spec_prompts())[0]


def assert_counts_agree(core: EngineCore, log: list[dict], stats: dict) -> None:
    """Engine counters == the spec log, line by line (every field, the verified per-position and unverified
    counts too) == the sum of per-request stats."""
    assert core.spec is not None
    from_log = spec_log_counters(log, K)
    assert core.spec.counters == from_log
    assert all(line["num_proposed_tokens"] == line["num_draft_tokens"] for line in log)  # nothing trimmed
    per_request = [s for s in stats.values() if s is not None]
    assert sum(s.num_drafts for s in per_request) == from_log.num_drafts
    assert sum(s.num_draft_tokens for s in per_request) == from_log.num_draft_tokens
    assert sum(s.num_accepted_tokens for s in per_request) == from_log.num_accepted_tokens
    assert [sum(s.accepted_length_hist[n] for s in per_request) for n in range(K + 1)] == (
        from_log.accepted_length_hist
    )
    assert [sum(s.num_draft_tokens_per_pos[i] for s in per_request) for i in range(K)] == (
        from_log.num_draft_tokens_per_pos
    )
    assert sum(s.num_unverified_draft_tokens for s in per_request) == from_log.num_unverified_draft_tokens


def simulate_ngram(prompt: list[int], expected: list[int], max_tokens: int, stops: list[int]) -> list[tuple]:
    """The drafts prompt lookup must make, and what each must count, when the target's tokens are known."""
    seq, out, drafts = list(prompt), [expected[0]], []
    seq.append(expected[0])
    while len(out) < max_tokens and out[-1] not in stops:
        room = min(K, max_tokens - len(out) - 1)
        draft = ngram_propose(seq, 1, 4, room) if room > 0 else []
        accepted = accepted_prefix_length(draft, expected[len(out) :])
        new = expected[len(out) : len(out) + accepted + 1]
        kept = next((j + 1 for j, t in enumerate(new) if t in stops), len(new))
        if draft:
            drafts.append((len(draft), min(kept, accepted)))
        out += new[:kept]
        seq += new[:kept]
    return drafts


def test_ngram_is_lossless_and_counted_exactly(
    target: Path, baseline: list[list[int]], tmp_path: Path
) -> None:
    """ngram K=7: the tokens of a run without speculation (and HF's); each draft counted as simulated."""
    log = tmp_path / "spec.jsonl"
    core = make_core(target, speculative=DrafterSpec("ngram", K), spec_log=log)
    prompts = spec_prompts()
    outputs, stats = run(core, prompts)
    assert outputs == baseline
    assert_hf_greedy(target, prompts, outputs)
    lines = read_log(log)
    assert (
        core.spec is not None and core.spec.counters.num_accepted_tokens > 0
    )  # lookups hit and were accepted
    for i, prompt in enumerate(prompts):
        expected = simulate_ngram(prompt, baseline[i], MAX_TOKENS[i], [])
        assert [
            (x["num_draft_tokens"], x["num_accepted"]) for x in lines if x["request_id"] == str(i)
        ] == expected
    assert_counts_agree(core, lines, stats)


def test_stop_token_inside_accepted_run(target: Path, baseline: list[list[int]], tmp_path: Path) -> None:
    """A stop token inside an accepted draft ends the output there; accepted counts up to and including it."""
    prompts = spec_prompts()
    stops = [[out[len(out) // 2]] for out in baseline]  # a token each greedy output really produces
    log = tmp_path / "spec.jsonl"
    core = make_core(target, speculative=DrafterSpec("ngram", K), spec_log=log)
    outputs, stats = run(core, prompts, stops)
    for out, base, stop in zip(outputs, baseline, stops, strict=True):
        assert out == base[: base.index(stop[0]) + 1]
    lines = read_log(log)
    for i, prompt in enumerate(prompts):
        expected = simulate_ngram(prompt, baseline[i], MAX_TOKENS[i], stops[i])
        assert [
            (x["num_draft_tokens"], x["num_accepted"]) for x in lines if x["request_id"] == str(i)
        ] == expected
    assert_counts_agree(core, lines, stats)


def test_dflash_is_lossless(target: Path, baseline: list[list[int]], tmp_path: Path) -> None:
    """A random tiny DFlash drafter (K=7) changes no token; its drafts are counted consistently."""
    draft = make_tiny_dflash_checkpoint(
        tmp_path / "draft", target, seed=1, block_size=8, target_layer_ids=(0,)
    )
    log = tmp_path / "spec.jsonl"
    core = make_core(target, speculative=DrafterSpec("dflash", K, draft), spec_log=log)
    prompts = spec_prompts()
    outputs, stats = run(core, prompts)
    assert outputs == baseline
    assert_hf_greedy(target, prompts, outputs)
    lines = read_log(log)
    assert len(lines) > 20  # it drafted
    assert all(x["num_draft_tokens"] <= min(K, MAX_TOKENS[int(x["request_id"])] - 1) for x in lines)
    assert_counts_agree(core, lines, stats)


def test_dflash_with_accepted_drafts_is_lossless(tmp_path: Path) -> None:
    """A DFlash pair whose drafts are often accepted (anchor-slot layout, a near-identity drafter, a target
    that tends to repeat): accepted KV is kept, the context grows through accepted tokens, tokens unchanged."""
    target = make_tiny_checkpoint(tmp_path / "t", seed=5, init_std=0.1, overrides=SMALL)
    draft = make_tiny_dflash_checkpoint(
        tmp_path / "d",
        target,
        seed=1,
        block_size=8,
        target_layer_ids=(0,),
        init_std=0.02,
        anchor=AnchorLayout.ANCHOR_SLOT,
    )
    prompts = spec_prompts()
    baseline = run(make_core(target), prompts)[0]
    core = make_core(target, speculative=DrafterSpec("dflash", K, draft))
    outputs, stats = run(core, prompts)
    assert outputs == baseline
    assert_hf_greedy(target, prompts, outputs)
    assert core.spec is not None
    counters = core.spec.counters
    assert (
        0.2 * counters.num_drafts < counters.num_accepted_tokens < counters.num_draft_tokens
    )  # partly accepted
    assert sum(s.num_accepted_tokens for s in stats.values() if s is not None) == counters.num_accepted_tokens


@pytest.mark.parametrize("method", ["ngram", "dflash"])
def test_first_decode_step_drafts(target: Path, tmp_path: Path, method: str) -> None:
    """The step that completes a prompt also proposes (z-lab's dflash_generate and vLLM do): step 0 prefills,
    samples and drafts, step 1 verifies. Chunked prefill too: only the chunk that completes the prompt drafts.
    (n-gram on the fake model, whose cycle makes the first token continue a phrase the prompt holds.)"""
    if method == "ngram":
        cycle = list(range(FIRST_CYCLE_TOKEN, FIRST_CYCLE_TOKEN + 12))
        prompt = cycle + cycle[:3]  # the first output token cycle[3] continues cycle[1:3]: a 3-gram hit
        core = make_core(
            target, fake_model=True, speculative=DrafterSpec("ngram", K), max_num_batched_tokens=8
        )
    else:
        draft = make_tiny_dflash_checkpoint(
            tmp_path / "d", target, seed=1, block_size=8, target_layer_ids=(0,)
        )
        prompt = list(range(5, 20))
        core = make_core(target, speculative=DrafterSpec("dflash", K, draft), max_num_batched_tokens=8)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    core.add_request(EngineCoreRequest("a", prompt, params))
    assert core.spec is not None
    core.step()  # 8 of 15 prompt tokens: no sample, no draft
    assert core.requests["a"].spec_token_ids == ()
    (out,) = core.step()  # the rest of the prompt: samples the first token and drafts
    assert len(out.new_token_ids) == 1 and len(core.requests["a"].spec_token_ids) == K
    core.step()  # the first decode step verifies them
    assert core.spec.counters.num_drafts == 1 and core.spec.counters.num_draft_tokens == K


def test_trimmed_and_unverified_rounds_are_counted_and_logged(target: Path, tmp_path: Path) -> None:
    """The plumbing for a scheduler that verifies fewer drafts than proposed: K=4, a round of 4 proposed with
    2 verified and 1 accepted, then a round of 3 proposed with none verified. The engine counters and the
    request's stats count a draft of 2 tokens and 2 + 3 unverified tokens; the spec log has a line per round
    (verified and proposed counts) that makes the same counters."""
    log = tmp_path / "spec.jsonl"
    core = make_core(target, fake_model=True, speculative=DrafterSpec("ngram", 4), spec_log=log)
    core.add_request(EngineCoreRequest("a", [5, 6, 7], SamplingParams(max_tokens=8, temperature=0.0)))
    request, spec = core.requests["a"], core.spec
    assert spec is not None and core.spec_log is not None
    spec.observe(request, 2, 1, num_proposed=4)
    spec.observe_unverified(request, 3)
    core.spec_log.flush()
    # reached [1, 1, 0, 0]: token 0 accepted, token 1 rejected; no confidences given
    expected = SpecDecodeCounters(
        4, 1, 2, 1, [1, 0, 0, 0], [0, 1, 0, 0, 0], [1, 1, 0, 0], 5, [1, 1, 0, 0], [0, 0, 0, 0]
    )
    assert spec.counters == expected and request.spec_stats == expected
    lines = read_log(log)
    assert [(x["num_draft_tokens"], x["num_accepted"], x["num_proposed_tokens"]) for x in lines] == [
        (2, 1, 4),
        (0, 0, 3),
    ]
    assert spec_log_counters(lines, 4) == expected


def test_confidences_are_counted_and_logged(target: Path, tmp_path: Path) -> None:
    """SpecDecoder.observe carries a confidence head's ratings of the verified drafts to the engine counters,
    the request's stats and the spec log: K=4, a round of 3 verified (of 4) rated [0.8, 0.6, 0.3] with 1
    accepted adds 0.8 and 0.6 at the positions it reached (0, 1); the log rebuilds the counters exactly.
    Confidences of the wrong length are refused before anything moves."""
    log = tmp_path / "spec.jsonl"
    core = make_core(target, fake_model=True, speculative=DrafterSpec("ngram", 4), spec_log=log)
    core.add_request(EngineCoreRequest("a", [5, 6, 7], SamplingParams(max_tokens=8, temperature=0.0)))
    request, spec = core.requests["a"], core.spec
    assert spec is not None and core.spec_log is not None
    with pytest.raises(ValueError, match="confidences"):
        spec.observe(request, 3, 1, num_proposed=4, confidence=[0.8, 0.6])
    assert spec.counters == SpecDecodeCounters.zero(4) and request.spec_stats is None
    spec.observe(request, 3, 1, num_proposed=4, confidence=[0.8, 0.6, 0.3])
    spec.observe(request, 2, 2)  # a round without confidences: reached moves, the sums do not
    core.spec_log.flush()
    expected = SpecDecodeCounters(
        4, 2, 5, 3, [2, 1, 0, 0], [0, 1, 1, 0, 0], [2, 2, 1, 0], 1, [2, 2, 0, 0], [800_000, 600_000, 0, 0]
    )
    assert spec.counters == expected and request.spec_stats == expected
    lines = read_log(log)
    assert [x["confidence_micros"] for x in lines] == [[800_000, 600_000, 300_000], []]
    assert spec_log_counters(lines, 4) == expected


def test_lossless_under_preemption_and_chunking(target: Path, baseline: list[list[int]]) -> None:
    """A small KV cache (preemption by recompute) and a small token budget (drafts cut short): same tokens."""
    core = make_core(target, speculative=DrafterSpec("ngram", K), num_kv_blocks=14, max_num_batched_tokens=24)
    outputs, _ = run(core, spec_prompts())
    assert outputs == baseline


def test_drafts_the_budget_leaves_out_are_unverified(
    target: Path, baseline: list[list[int]], tmp_path: Path
) -> None:
    """A 9-token budget cuts drafts short and leaves some rounds none: each round's proposal (the n-gram
    drafter's, which the spec log records) is verified up to what fits, the rest counted as unverified and
    never as rejected; the counters are the log's, and the tokens those of no speculation."""
    log = tmp_path / "spec.jsonl"
    core = make_core(target, speculative=DrafterSpec("ngram", K), max_num_batched_tokens=9, spec_log=log)
    outputs, _ = run(core, spec_prompts())
    assert outputs == baseline
    lines = read_log(log)
    cut = [x for x in lines if x["num_draft_tokens"] < x["num_proposed_tokens"]]
    assert cut and any(x["num_draft_tokens"] == 0 for x in cut)
    assert core.spec is not None and core.spec.counters == spec_log_counters(lines, K)
    unverified = sum(x["num_proposed_tokens"] - x["num_draft_tokens"] for x in lines)
    assert core.spec.counters.num_unverified_draft_tokens == unverified > 0


def test_drafter_load_and_unload_at_run_time(target: Path, baseline: list[list[int]]) -> None:
    """None, K=3, none, K=7, K=7: zero after none or a new K, kept for the same K; tokens unchanged."""
    core = make_core(target)
    assert core.load_snapshot().spec_decode is None
    core.load_drafter(DrafterSpec("ngram", 3))
    assert core.load_snapshot().spec_decode == SpecDecodeCounters.zero(3)
    outputs, _ = run(core, spec_prompts())
    assert outputs == baseline
    core.unload_drafter()
    assert core.load_snapshot().spec_decode is None
    core.load_drafter(DrafterSpec("ngram", 7))
    assert core.load_snapshot().spec_decode == SpecDecodeCounters.zero(7)
    run(core, spec_prompts())
    counted = core.load_snapshot().spec_decode
    assert counted is not None and counted.num_drafts > 0
    core.load_drafter(DrafterSpec("ngram", 7, prompt_lookup_min=2))  # same K: the counters go on
    assert core.load_snapshot().spec_decode == counted


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (DrafterSpec("ngram", 33), "MAX_SPEC_TOKENS=32"),
        (DrafterSpec("ngram", 0), "MAX_SPEC_TOKENS=32"),
        (DrafterSpec("eagle", 7), "unknown --spec-method"),
    ],
)
def test_bad_drafter_is_refused(target: Path, spec: DrafterSpec, message: str) -> None:
    """K > 32 (never clamped) or an unknown method: a clear error, old drafter kept."""
    core = make_core(target, speculative=DrafterSpec("ngram", 4))
    with pytest.raises(ValueError, match=message):
        core.load_drafter(spec)
    assert core.spec is not None and core.spec.num_spec_tokens == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_speculation_is_lossless_on_cuda(target: Path, tmp_path: Path) -> None:
    """On CUDA (float32), ngram, DFlash K=7 and DSpark K=7 (confidence head on, adaptive verification off)
    give the tokens of the same engine without speculation; at temperature 1, DSpark's sampled drafts run on
    CUDA with every snapshot's counters within docs/design.md's invariants."""
    base = run(make_core(target, device="cuda:0", dtype="float32"), spec_prompts())[0]
    draft = make_tiny_dflash_checkpoint(
        tmp_path / "draft", target, seed=1, block_size=8, target_layer_ids=(0,)
    )
    dspark = make_tiny_dspark_checkpoint(
        tmp_path / "dspark", target, seed=1, block_size=8, target_layer_ids=(0,)
    )
    specs = (DrafterSpec("ngram", K), DrafterSpec("dflash", K, draft), DrafterSpec("dspark", K, dspark))
    for spec in specs:
        core = make_core(target, device="cuda:0", dtype="float32", speculative=spec)
        assert run(core, spec_prompts())[0] == base, spec.method
        assert core.spec is not None and core.spec.counters.num_drafts > 0
    core = make_core(target, device="cuda:0", dtype="float32", speculative=specs[2])
    for i, prompt in enumerate(spec_prompts()):
        params = SamplingParams(max_tokens=24, temperature=1.0, ignore_eos=True, seed=i)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    steps, sampled = CheckedSteps(core), 0
    while core.has_work:
        sampled += sum(len(r.spec_token_ids) for r in core.scheduler.running if r.spec_probs is not None)
        steps.step()
    assert sampled > 0 and core.spec is not None and core.spec.counters.num_drafts > 0
