"""Prefix caching on a Qwen3.5 (hybrid) target: a hit starts from the state kept after the prefix (at a
multiple of the prefix interval, vLLM's "align" mode), so its tokens are those of a run without the cache;
queries and hits are counted in tokens at first admission, as vLLM counts them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.kv_sizing import prefix_interval
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "t", seed=3)


@pytest.fixture(scope="module")
def interval(target: Path) -> int:
    # 3 DeltaNet layers' state (16.5 KiB) against one full layer's 2 KiB page of 16 tokens: 9 blocks
    value = prefix_interval(ModelConfig.from_folder(target), 16, torch.float32)
    assert value == 144
    return value


def shared_prefix_prompts(prefix_len: int, seed: int = 0) -> list[list[int]]:
    """Three prompts on one prefix of ``prefix_len`` tokens, with tails of 1, 2 and 20 tokens."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(3, 512) for _ in range(tail)] for tail in (1, 2, 20)]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return shared_prefix_prompts(300)


@pytest.fixture(scope="module")
def expected(target: Path, prompts: list[list[int]]) -> list[list[int]]:
    return uncached(target, prompts)


def uncached(target: Path, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt alone on a core without prefix caching."""
    return [
        generate_greedy(make_core(target, enable_prefix_caching=False), [p], MAX_TOKENS)[0] for p in prompts
    ]


@pytest.mark.parametrize(
    ("budget", "first_hits"), [(2048, 0), (48, 2)], ids=["one-chunk", "chunks-ending-on-the-interval"]
)
def test_a_repeated_batch_hits_at_the_kept_states(
    target: Path,
    interval: int,
    prompts: list[list[int]],
    expected: list[list[int]],
    budget: int,
    first_hits: int,
) -> None:
    """Three 300+-token prompts sharing 300 tokens, twice on one core. Every prompt may hit 288 tokens (2
    intervals: the states kept at 144 and 288, mid-chunk in one 2048-token step, or at the end of a 48-token
    chunk, copied from its group slot) once a step has kept them: in one 2048-token step the first batch is
    admitted at once and hits nothing; 48 tokens a step admit the second and third prompts after the first
    one's prefill, and they hit. The second batch hits 288 tokens each. Every token is the uncached run's."""
    core = make_core(target, max_num_batched_tokens=budget)
    assert generate_greedy(core, prompts, MAX_TOKENS) == expected
    counters = core.load_snapshot().prefix_cache
    queries = sum(map(len, prompts))
    assert counters is not None and (counters.queries, counters.hits) == (queries, first_hits * 2 * interval)
    assert generate_greedy(core, prompts, MAX_TOKENS) == expected
    counters = core.load_snapshot().prefix_cache
    assert counters is not None
    assert (counters.queries, counters.hits) == (2 * queries, (first_hits + 3) * 2 * interval)


def test_a_next_turn_hits_the_state_kept_while_decoding(target: Path, interval: int) -> None:
    """A 130-token prompt decodes past position 144 (the state there is kept from a decode step); a second
    request on that prompt, its output and 10 more tokens hits 144 tokens, and its tokens are uncached's."""
    first = shared_prefix_prompts(130)[0][:130]
    core = make_core(target)
    output = generate_greedy(core, [first], 30)[0]
    follow_up = first + output + list(range(40, 50))
    assert generate_greedy(core, [follow_up], MAX_TOKENS) == uncached(target, [follow_up])
    counters = core.load_snapshot().prefix_cache
    assert counters is not None and counters.hits == interval


def test_ngram_with_prefix_hits_is_lossless(
    target: Path, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    """Prompt lookup K=4 on a core whose second batch hits the kept states: the uncached tokens."""
    core = make_core(target, speculative=DrafterSpec("ngram", 4))
    for _ in range(2):
        assert generate_greedy(core, prompts, MAX_TOKENS) == expected
    counters = core.load_snapshot().prefix_cache
    assert counters is not None and counters.hits > 0


def test_dflash_with_prefix_hits_is_lossless(
    target: Path, prompts: list[list[int]], expected: list[list[int]], tmp_path: Path
) -> None:
    """A random DFlash drafter (its context keys in the same blocks: it hits only blocks whose context it
    wrote) on a core whose second batch hits the kept states: the uncached tokens, and hits counted."""
    draft = make_tiny_dflash_checkpoint(
        tmp_path / "draft", target, seed=1, block_size=8, target_layer_ids=(1, 3)
    )
    # 2048 tokens a step: the first batch is admitted at once and hits nothing, the second 288 tokens each
    core = make_core(target, speculative=DrafterSpec("dflash", 7, draft), max_num_batched_tokens=2048)
    for _ in range(2):
        assert generate_greedy(core, prompts, MAX_TOKENS) == expected
    counters = core.load_snapshot().prefix_cache
    assert counters is not None and counters.hits == 3 * 2 * 144
