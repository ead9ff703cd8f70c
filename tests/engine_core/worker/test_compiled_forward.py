"""The compiled model step (``-O3``: torch.compile, inductor, frozen weights) is exact: its logits equal the
eager stack's within float32 tolerance, step by step (prefill chunks, decode, a one-token step), and an
engine's greedy tokens equal eager's for Qwen3 (with DFlash and n-gram, lossless), Qwen3-MoE and Qwen3.5
(hybrid, with prefix caching hits); a second compile with the same cache folder is served from it; a host
without a C++ compiler runs eagerly after one warning; --enforce-eager and -O0 mean no compile. Compiles are
kept few (the artifacts of one module share a cache folder)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo

from openinfer.engine_core.builtin_model import builtin_drafter_folder, builtin_target_folder
from openinfer.engine_core.compilation_config import CompilationConfig
from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.testing.engine_cores import generate_greedy, generate_with, make_core
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.protocol import StructuredOutputs

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}

PROMPTS = [list(range(3, 43)), list(range(200, 221)), [7, 9, 11]]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> CompilationConfig:
    return CompilationConfig(level=3, cache_dir=str(tmp_path_factory.mktemp("compile-cache")))


def fresh_core(folder: Path, **overrides: object) -> EngineCore:
    """An engine core compiling its model afresh, as an engine process does (dynamo keeps every model's
    graphs under one code object, at most 8: a test that makes several forgets the earlier ones)."""
    torch._dynamo.reset()
    return make_core(folder, **overrides)


def test_logits_equal_eager_step_by_step(compiled: CompilationConfig) -> None:
    """The built-in Qwen3 over one KV cache each: two requests' prefill in one step, a decode step of both,
    then one token alone (its own graph); every step's logits equal eager's to 1e-4."""
    torch._dynamo.reset()
    runners = [
        ModelRunner(builtin_target_folder(), torch.device("cpu"), 32, 16, torch.float32, compilation=config)
        for config in (None, compiled)
    ]
    assert runners[0].compiled is None and runners[1].compiled is not None
    a, b = PROMPTS[0], PROMPTS[1]
    tables = [list(range(0, 4)), list(range(4, 8))]  # 4 blocks of 16 each
    steps = [
        [SeqChunk(a, 0, tables[0], 2), SeqChunk(b, 0, tables[1], 1)],
        [SeqChunk([5], len(a), tables[0]), SeqChunk([6], len(b), tables[1])],
        [SeqChunk([8], len(a) + 1, tables[0])],
    ]
    for chunks in steps:
        eager, fast = (r.execute(chunk_step(chunks, r)).logits.numpy() for r in runners)
        np.testing.assert_allclose(fast, eager, atol=1e-4, rtol=0)


def test_qwen3_greedy_and_speculation_lossless(compiled: CompilationConfig) -> None:
    """The built-in Qwen3: compiled greedy tokens equal eager's, and with DFlash (its aux layers traced into
    their own graph) and n-gram drafting they are unchanged."""
    eager = generate_greedy(make_core(builtin_target_folder()), PROMPTS, MAX_TOKENS)
    assert (
        generate_greedy(make_core(builtin_target_folder(), compilation=compiled), PROMPTS, MAX_TOKENS)
        == eager
    )
    for spec in (DrafterSpec("dflash", 7, builtin_drafter_folder("dflash")), DrafterSpec("ngram", 3)):
        core = make_core(builtin_target_folder(), compilation=compiled, speculative=spec)
        assert generate_greedy(core, PROMPTS, MAX_TOKENS) == eager, spec.method
        assert core.spec is not None and core.spec.counters.num_drafts > 0


def test_dspark_and_structured_output_unchanged(compiled: CompilationConfig) -> None:
    """The built-in DSpark pair compiled (confidence-set verify lengths) is lossless, and a regex and a JSON
    schema constraint write the same tokens compiled as eager, with and without the drafter."""
    constraints = [
        StructuredOutputs("regex", r"[0-9]{2,4}-(yes|no)"),
        StructuredOutputs("json", json.dumps(SCHEMA), any_whitespace=False),
    ]
    each = [{"structured_outputs": c} for c in constraints] + [{}]
    eager, _ = generate_with(make_core(builtin_target_folder()), PROMPTS, each, max_tokens=24)
    dspark = DrafterSpec("dspark", 7, builtin_drafter_folder("dspark"))
    for spec in (None, dspark):
        core = fresh_core(builtin_target_folder(), compilation=compiled, speculative=spec)
        assert generate_with(core, PROMPTS, each, max_tokens=24)[0] == eager, spec
    assert core.spec is not None and core.spec.counters.num_drafts > 0


def test_compile_sizes_get_their_own_graphs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """compile_sizes [3, 40]: warm-up compiles a graph for exactly 3 and exactly 40 tokens beside the
    dynamic one (40 tokens span three scratch blocks); a 3-token step takes its graph and equals eager."""
    torch._dynamo.reset()
    sized = CompilationConfig(level=3, cache_dir=str(tmp_path / "cache"), compile_sizes=[3, 40])
    with caplog.at_level(logging.INFO, logger="openinfer.engine_core.worker.compiled_forward"):
        runners = [
            ModelRunner(builtin_target_folder(), torch.device("cpu"), 32, 16, torch.float32, compilation=c)
            for c in (None, sized)
        ]
    lines = [r.getMessage() for r in caplog.records if "compiled the model step" in r.getMessage()]
    assert [line.split(" in ")[0] for line in lines] == [
        "compiled the model step for 1 tokens",
        "compiled the model step for 2 tokens",
        "compiled the model step for exactly 3 tokens",
        "compiled the model step for exactly 40 tokens",
    ]
    caplog.clear()
    chunks = [SeqChunk([5, 6, 7], 0, [0])]
    with caplog.at_level(logging.INFO, logger="openinfer.engine_core.worker.compiled_forward"):
        eager, fast = (r.execute(chunk_step(chunks, r)).logits.numpy() for r in runners)
    assert "compiled" not in caplog.text  # served by the graph warm-up made
    np.testing.assert_allclose(fast, eager, atol=1e-4, rtol=0)


def test_moe_greedy(compiled: CompilationConfig, tmp_path: Path) -> None:
    """Qwen3-MoE: the experts run as one opaque op per layer; greedy tokens equal eager's."""
    folder = make_tiny_moe_checkpoint(tmp_path / "moe", seed=1)
    eager = generate_greedy(make_core(folder), PROMPTS, MAX_TOKENS)
    assert generate_greedy(fresh_core(folder, compilation=compiled), PROMPTS, MAX_TOKENS) == eager


def test_hybrid_greedy_with_prefix_hits(compiled: CompilationConfig, tmp_path: Path) -> None:
    """Qwen3.5 (Gated DeltaNet layers as opaque ops over the state slots): greedy tokens equal eager's, and a
    second batch sharing a 160-token prefix (past the kept state) hits it and still equals eager."""
    folder = make_tiny_qwen3_5_checkpoint(tmp_path / "q35", seed=3)
    shared = list(range(3, 163))
    waves = [[shared + [5, 6]], [shared + [7], shared + [8, 9]]]
    eager_core, compiled_core = make_core(folder), fresh_core(folder, compilation=compiled)
    for wave in waves:
        assert generate_greedy(compiled_core, wave, 8) == generate_greedy(eager_core, wave, 8)
    counters = compiled_core.kv_cache.counters
    assert counters is not None and counters.hits > 0 and counters == eager_core.kv_cache.counters


def test_a_second_compile_is_served_from_the_cache(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Compiled once into a fresh cache folder, then, after dynamo forgets its compiled code (as a restarted
    engine has none), again: the second time every graph comes from the folder (the log says 0 missed)."""
    config = CompilationConfig(level=3, cache_dir=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="openinfer.engine_core.worker.compiled_forward"):
            generate_greedy(fresh_core(builtin_target_folder(), compilation=config), PROMPTS, 2)
        runs.append([r.getMessage() for r in caplog.records if "compiled the model step" in r.getMessage()])
    first, second = runs
    assert first and len(first) == len(second) and all("1 missed" in line for line in first), runs
    assert all("1 hit, 0 missed" in line for line in second), runs


def test_eager_without_a_compiler_and_under_enforce_eager(
    compiled: CompilationConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """$CXX naming no compiler: one warning, then the eager stack; --enforce-eager and level 0 compile
    nothing."""
    monkeypatch.setenv("CXX", "no-such-compiler")
    with caplog.at_level(logging.WARNING):
        core = make_core(builtin_target_folder(), compilation=compiled)
    assert core.runner.compiled is None  # type: ignore[attr-defined]
    assert "runs eagerly, not compiled: no C++ compiler (no-such-compiler)" in caplog.text
    monkeypatch.delenv("CXX")
    assert (
        make_core(builtin_target_folder(), compilation=compiled, enforce_eager=True).runner.compiled is None
    )  # type: ignore[attr-defined]
    level0 = CompilationConfig(level=0)
    assert make_core(builtin_target_folder(), compilation=level0).runner.compiled is None  # type: ignore[attr-defined]
