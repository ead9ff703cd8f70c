"""Speculative decoding, prefix caching, penalties and structured outputs over a Qwen3-MoE target: lossless at
temperature 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.engine_cores import generate_greedy, generate_with, make_core, spec_prompts
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint
from openinfer.protocol import StructuredOutputs

K = 7
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 3 layers, the first dense: the drafter's features come from a sparse and a dense layer
    overrides = {"num_hidden_layers": 3, "mlp_only_layers": [0]}
    return make_tiny_moe_checkpoint(tmp_path_factory.mktemp("moe") / "t", seed=5, overrides=overrides)


@pytest.fixture(scope="module")
def baseline(target: Path) -> list[list[int]]:
    return generate_greedy(make_core(target), spec_prompts(), MAX_TOKENS)


def test_ngram_on_moe_is_lossless(target: Path, baseline: list[list[int]]) -> None:
    """ngram K=7 with chunked prefill (24 tokens a step) changes no token of the MoE target's greedy run."""
    core = make_core(target, speculative=DrafterSpec("ngram", K), max_num_batched_tokens=24)
    assert generate_greedy(core, spec_prompts(), MAX_TOKENS) == baseline
    assert core.spec is not None and core.spec.counters.num_draft_tokens > 0  # it drafted


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_block_drafters_on_moe_are_lossless(
    target: Path, baseline: list[list[int]], tmp_path: Path, method: str
) -> None:
    """A random DFlash or DSpark drafter fed layers 0 (dense) and 1 (sparse) through forward_with_aux: the
    tokens of a run without a drafter, which are HF's."""
    make = make_tiny_dflash_checkpoint if method == "dflash" else make_tiny_dspark_checkpoint
    draft = make(tmp_path / "draft", target, seed=1, block_size=8, target_layer_ids=(0, 1))
    core = make_core(target, speculative=DrafterSpec(method, K, draft))
    outputs = generate_greedy(core, spec_prompts(), MAX_TOKENS)
    assert outputs == baseline
    assert core.spec is not None and core.spec.counters.num_draft_tokens > 0
    assert_hf_greedy(target, spec_prompts(), outputs)


def test_prefix_cache_hits_on_moe_keep_the_tokens(target: Path, baseline: list[list[int]]) -> None:
    """The same batch again on one core reads its prompts' cached blocks and gives the same tokens."""
    core = make_core(target)
    assert generate_greedy(core, spec_prompts(), MAX_TOKENS) == baseline
    assert generate_greedy(core, spec_prompts(), MAX_TOKENS) == baseline
    counters = core.load_snapshot().prefix_cache
    assert counters is not None and counters.hits > 0  # the second batch read cached blocks


def test_penalties_and_a_choice_constraint_on_moe_are_lossless_with_ngram(target: Path) -> None:
    """Penalties and bias, then a choice constraint: n-gram K=7 gives the tokens of a run without a drafter."""
    penalties = {"repetition_penalty": 1.2, "frequency_penalty": -0.5, "logit_bias": {7: 2.0}}
    choice = {
        "structured_outputs": StructuredOutputs("choice", json.dumps(["thou art", "ROMEO"])),
        "ignore_eos": False,
    }
    for options in (penalties, choice):
        base = generate_with(make_core(target), spec_prompts(), **options)
        core = make_core(target, speculative=DrafterSpec("ngram", K))
        assert generate_with(core, spec_prompts(), **options) == base
        assert core.spec is not None and core.spec.counters.num_drafts > 0
