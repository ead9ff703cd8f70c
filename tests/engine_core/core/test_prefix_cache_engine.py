"""Prefix caching in the engine core, on a real tiny Qwen3: the same greedy tokens with caching on and off
(and Hugging Face's, teacher-forced), with and without drafters, through eviction, preemption and aborts;
queries and hits exactly what the requests imply."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.request import Request
from openinfer.engine_core.testing.dspark_checkpoint import dspark_from_dflash
from openinfer.engine_core.testing.engine_cores import make_core
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3 as SMALL
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.protocol import EngineCoreRequest, PrefixCacheCounters, SamplingParams

ONE_STEP_WAVES = {"max_num_batched_tokens": 2048}  # a wave of requests is admitted in one step

BLOCK = 16
MAX_TOKENS = 12
Wave = list[tuple[str, list[int]]]  # requests sent together: (request id, prompt)


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(n)]


def make_waves(first_output: list[int] | None = None, seed: int = 0) -> list[Wave]:
    """A first request, then requests that share its prefix in every way: the same prompt (cached but for
    its last block), a prompt that is a cached prefix, a longer prefix of it, a duplicate sent in the same
    step (it shares what the other schedules), the first turn's prompt and answer and a new message, and an
    unrelated prompt."""
    rng = random.Random(seed)
    shared = tokens(rng, 40)
    first = shared + tokens(rng, 20)
    other = shared + tokens(rng, 20)
    follow_up = first + (first_output or tokens(rng, MAX_TOKENS)) + tokens(rng, 5)
    return [
        [("first", first)],
        [("same", first), ("prefix", shared[:32]), ("other", other), ("other-again", other),
         ("follow-up", follow_up), ("unrelated", tokens(rng, 30))],
    ]  # fmt: skip


def expected_hits(waves: list[Wave], outputs: dict[str, list[int]]) -> dict[str, int]:
    """vLLM's semantics as a model of its own: each wave admitted in one step in order, a request hitting
    the longest chain of full blocks (before its last token) that earlier requests computed or scheduled."""
    cached: set[tuple[int, ...]] = set()
    hits = {}
    for wave in waves:
        for request_id, prompt in wave:
            n = 0
            while n + BLOCK <= len(prompt) - 1 and tuple(prompt[: n + BLOCK]) in cached:
                n += BLOCK
            hits[request_id] = n
            cached.update(tuple(prompt[:end]) for end in range(BLOCK, len(prompt) + 1, BLOCK))
        for request_id, prompt in wave:  # all but the last output token were computed
            computed = prompt + outputs[request_id][:-1]
            cached.update(tuple(computed[:end]) for end in range(BLOCK, len(computed) + 1, BLOCK))
    return hits


class Run:
    """The waves through one engine core, one after another; each request's tokens, its first output's
    cached tokens and its drafts' accepted counts (from the spec log) in order."""

    def __init__(
        self,
        core: EngineCore,
        waves: list[Wave],
        spec_log: Path | None = None,
        abort: tuple[str, int] | None = None,  # this request is aborted before this step of its wave
        max_tokens: int = MAX_TOKENS,
    ) -> None:
        self.outputs: dict[str, list[int]] = defaultdict(list)
        self.cached: dict[str, int] = {}
        for wave in waves:
            for request_id, prompt in wave:
                params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
                core.add_request(EngineCoreRequest(request_id, prompt, params))
            steps = 0
            while core.has_work:
                steps += 1
                if abort is not None and steps == abort[1]:
                    core.abort([abort[0]])  # ignored in waves it is not part of
                for out in core.step():
                    if out.request_id not in self.cached:
                        self.cached[out.request_id] = out.num_cached_tokens
                    self.outputs[out.request_id].extend(out.new_token_ids)
        self.counters = core.load_snapshot().prefix_cache
        self.rounds: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for line in spec_log.read_text().splitlines() if spec_log else []:
            entry = json.loads(line)
            self.rounds[entry["request_id"]].append((entry["num_draft_tokens"], entry["num_accepted"]))
        assert core.kv_cache.num_used_blocks == 0  # every reference let go


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target") / "t", seed=5, overrides=SMALL)


@pytest.fixture(scope="module")
def uncached(target: Path) -> Run:
    return Run(make_core(target, **ONE_STEP_WAVES, enable_prefix_caching=False), make_waves())


def all_prompts(waves: list[Wave]) -> dict[str, list[int]]:
    return {request_id: prompt for wave in waves for request_id, prompt in wave}


def test_same_tokens_and_exact_counts(target: Path, uncached: Run) -> None:
    waves = make_waves()
    run = Run(make_core(target, **ONE_STEP_WAVES), waves)
    assert run.outputs == uncached.outputs
    prompts = all_prompts(waves)
    assert_hf_greedy(target, list(prompts.values()), [run.outputs[r] for r in prompts])
    hits = expected_hits(waves, run.outputs)
    assert run.cached == hits
    assert (
        hits["same"] == 48 and hits["prefix"] == 16 and hits["other-again"] == 48 and hits["unrelated"] == 0
    )
    assert run.counters == PrefixCacheCounters(sum(map(len, prompts.values())), sum(hits.values()))
    assert uncached.counters is None and set(uncached.cached.values()) == {0}


def test_follow_up_turn_reuses_the_answer(target: Path, uncached: Run) -> None:
    """A conversation's next turn hits the blocks its previous answer filled (decode steps cache them too)."""
    waves = make_waves(first_output=uncached.outputs["first"])
    run = Run(make_core(target, **ONE_STEP_WAVES), waves)
    hits = expected_hits(waves, run.outputs)
    assert run.cached == hits and hits["follow-up"] == 64  # 60 prompt tokens, 4 of the answer
    assert run.outputs == Run(make_core(target, **ONE_STEP_WAVES, enable_prefix_caching=False), waves).outputs


def test_eviction_preemption_and_abort_with_shared_blocks(target: Path) -> None:
    """A KV cache far too small for everything: cached blocks are evicted, requests that share blocks are
    preempted and one is aborted mid-run; every other request's tokens are the same as without caching."""
    rng = random.Random(1)
    flush = [[(f"long{i}", tokens(rng, 150)) for i in range(3)]]  # 11 of the 12 blocks each
    waves = make_waves() + flush + make_waves()  # the second pass finds much of the first one evicted
    waves = [[(f"{request_id}-{i}", prompt) for request_id, prompt in wave] for i, wave in enumerate(waves)]
    aborted = "same-1"  # the first of its wave: admitted at once, aborted after two steps
    runs: dict[bool, Run] = {}
    preempted_sharing: list[bool] = []  # per preemption: did the request share a block with another?
    for caching in (True, False):
        core = make_core(target, **ONE_STEP_WAVES, enable_prefix_caching=caching, num_kv_blocks=12)
        if caching:
            core.scheduler._preempt = observed(core, preempted_sharing)  # type: ignore[method-assign]
        runs[caching] = Run(core, waves, abort=(aborted, 3))
    on, off = runs[True], runs[False]
    full = Run(make_core(target, **ONE_STEP_WAVES), waves)
    assert any(preempted_sharing)  # it ran short of blocks while they were shared
    assert 0 < len(on.outputs[aborted]) < MAX_TOKENS
    assert on.outputs[aborted] == full.outputs[aborted][: len(on.outputs[aborted])]
    del on.outputs[aborted], off.outputs[aborted]
    assert on.outputs == off.outputs
    assert on.counters is not None and full.counters is not None
    assert 0 < on.counters.hits < full.counters.hits  # some were evicted before they were asked for again
    assert on.counters.queries == full.counters.queries


def observed(core: EngineCore, sharing: list[bool]) -> Callable[[Request], None]:
    """The scheduler's own preemption, noting whether the preempted request shared a block."""
    preempt = core.scheduler._preempt

    def preempt_and_note(request: Request) -> None:
        sharing.append(any(core.kv_cache._refs[block] > 1 for block in request.block_ids))
        preempt(request)

    return preempt_and_note


@pytest.mark.parametrize("method", ["ngram", "dflash", "dspark"])
def test_speculation_is_lossless_with_hits(pair: tuple[Path, Path], method: str, tmp_path: Path) -> None:
    """n-gram, DFlash and DSpark with caching on: the tokens of no drafter and no caching; the block drafters
    accept exactly the same in every round with caching on and off (their context for a cached block is the
    one they wrote)."""
    target, draft = pair
    if method == "dspark":  # the DFlash drafter's backbone with DSpark's heads, in DeepSpec's layout
        draft = dspark_from_dflash(draft, tmp_path / "dspark", target)
    waves = make_waves()
    baseline = Run(make_core(target, **ONE_STEP_WAVES, enable_prefix_caching=False), waves)
    runs = {}
    for caching in (True, False):
        log = tmp_path / f"{caching}.jsonl"
        spec = DrafterSpec(method, 4, None if method == "ngram" else draft)
        core = make_core(
            target, **ONE_STEP_WAVES, enable_prefix_caching=caching, speculative=spec, spec_log=log
        )
        runs[caching] = Run(core, waves, spec_log=log)
    on, off = runs[True], runs[False]
    assert on.outputs == off.outputs == baseline.outputs
    hits = expected_hits(waves, on.outputs)
    if method == "ngram":
        assert on.cached == hits
    else:  # blocks computed in a step are hits for the drafter once it has written their context, after it
        assert on.cached["other"] == hits["other"] == 32 and on.cached["other-again"] == 32
        assert all(on.cached[r] <= hits[r] for r in hits)
    assert sum(n for rounds in on.rounds.values() for _, n in rounds) > 0  # drafts were accepted
    assert on.rounds == off.rounds


def test_a_new_dflash_drafter_reads_only_context_it_wrote(pair: tuple[Path, Path]) -> None:
    """Cached blocks whose drafter context another DFlash load wrote are no hits for the new one (the target
    recomputes them, and the new drafter writes their context); an n-gram drafter reads no context."""
    target, draft = pair
    prompt = list(range(10, 60))
    core = make_core(target, **ONE_STEP_WAVES, speculative=DrafterSpec("dflash", 4, draft))
    runs = [Run(core, [[("a", prompt)]]), Run(core, [[("b", prompt)]])]
    core.load_drafter(DrafterSpec("dflash", 4, draft))
    runs += [Run(core, [[("c", prompt)]]), Run(core, [[("d", prompt)]])]  # d reads what c's drafter wrote
    # A request that ends in the step that computes its prompt never hands the drafter that context.
    once = list(range(100, 150))
    assert Run(core, [[("y", once)]], max_tokens=1).cached == {"y": 0}
    assert Run(core, [[("z", once)]]).cached == {"z": 0}
    core.load_drafter(DrafterSpec("ngram", 4))
    runs.append(Run(core, [[("e", prompt)]]))
    assert [run.cached for run in runs] == [{"a": 0}, {"b": 48}, {"c": 0}, {"d": 48}, {"e": 48}]
    assert all(
        run.outputs[request_id] == runs[0].outputs["a"] for run, request_id in zip(runs, "abcde", strict=True)
    )


def test_a_failed_step_leaves_nothing_cached_and_loses_no_output(target: Path) -> None:
    """A step that raises may have written anything into the blocks it scheduled: the engine forgets every
    cached block (the next request computes its prompt); an abort answered before it is still sent."""
    prompt = list(range(10, 60))
    core = make_core(target, **ONE_STEP_WAVES)
    Run(core, [[("a", prompt)]])
    execute = core.runner.execute

    def broken(*args: object) -> None:
        raise RuntimeError("a broken step")

    core.runner.execute = broken  # type: ignore[method-assign,assignment]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    core.add_request(EngineCoreRequest("b", prompt, params))
    core.add_request(EngineCoreRequest("gone", prompt, params))
    core.abort(["gone"])
    with pytest.raises(RuntimeError):
        core.step()
    (failed,) = core.fail_running("the step failed")
    assert (failed.request_id, failed.finish and failed.finish.kind) == ("b", "error")
    core.runner.execute = execute  # type: ignore[method-assign]
    (aborted,) = core.step()
    assert (aborted.request_id, aborted.finish and aborted.finish.kind) == ("gone", "abort")
    assert Run(core, [[("c", prompt)]]).cached == {"c": 0}
