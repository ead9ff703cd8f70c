"""Padded fixed-shape steps (the shapes CUDA graphs replay) give the tokens of the unpadded step."""

from __future__ import annotations

import random
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from openinfer.engine_core.compilation_config import CompilationConfig
from openinfer.engine_core.config import DrafterSpec, EngineConfig, ModelDtype
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.models.kv_geometry import StateGeometry
from openinfer.engine_core.models.qwen3_5 import Qwen3_5ForCausalLM
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core
from openinfer.engine_core.testing.qwen3_5_checkpoint import (
    REPETITIVE_VOCAB,
    make_repetitive_qwen3_5_checkpoint,
    make_tiny_qwen3_5_checkpoint,
)
from openinfer.engine_core.testing.qwen3_moe_checkpoint import make_tiny_moe_checkpoint
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step, step_of_chunks
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.step_batch import StepBatch, expand_runs
from openinfer.engine_core.worker.step_graphs import StepGraphs, bucket_for, pad_step, uniform_query_len
from openinfer.protocol import EngineCoreRequest, SamplingParams

SMALL = SMALL_QWEN3
BLOCK_SIZE = 4
NUM_BLOCKS = 48
GROUP = 4  # a hybrid target's state slots per request: chunk b's are GROUP * b ... GROUP * b + 3
STATES = StateGeometry(3, GROUP)  # slot 12 is the scratch slot


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target") / "t", seed=3, overrides=SMALL)


def padded(runner: ModelRunner) -> ModelRunner:
    """``runner`` with its decode and verify steps run padded, eagerly (the CPU twin of graph replay)."""
    buckets = CompilationConfig().capture_sizes(8)  # 1, 2, 4, 8
    runner.step_graphs = StepGraphs(
        runner.model, runner.kv_caches, runner.block_size, runner.num_kv_blocks, 256, buckets,
        capture=False, state_geometry=runner.state_geometry,
    )  # fmt: skip
    return runner


def keep_states(step: StepBatch, read_offsets: list[int] | None = None) -> StepBatch:
    """A hybrid step whose chunk b keeps every token's state (token i in slot i of group b, as a verification
    does) and, with ``read_offsets``, starts from slot read_offsets[b] of its group; a dense step as it is."""
    if step.state_read is None:
        return step
    base = GROUP * np.arange(step.num_chunks)
    chunk_of, offsets = expand_runs(np.zeros(step.num_chunks, dtype=np.int64), step.query_lens)
    reads = step.state_read if read_offsets is None else base + np.array(read_offsets)
    return replace(step, state_read=reads, state_write=base[chunk_of] + offsets)


def assert_same_states(got: ModelRunner, expected: ModelRunner, exact: bool = False) -> None:
    """Every DeltaNet layer's conv and recurrent states equal, in every slot but the scratch one."""
    assert isinstance(got.model, Qwen3_5ForCausalLM) and isinstance(expected.model, Qwen3_5ForCausalLM)
    assert got.state_geometry is not None
    scratch = got.state_geometry.scratch_slot
    for mine, theirs in zip(got.model.linear_layers, expected.model.linear_layers, strict=True):
        for a, b in ((mine.conv_state, theirs.conv_state), (mine.recurrent_state, theirs.recurrent_state)):
            assert a is not None and b is not None and a.abs().max() > 0  # the steps stored states
            if exact:
                assert torch.equal(a[:scratch], b[:scratch])
            torch.testing.assert_close(a[:scratch], b[:scratch], atol=1e-5, rtol=1e-5)


def test_shapes_and_buckets() -> None:
    """Decodes and verifications are uniform (q = the longest, up to its query bucket); a prefill chunk is
    not; batch buckets round up too."""
    decode, verify = SeqChunk([5], 7, [0, 1]), SeqChunk([5, 6, 7], 3, [2, 4], num_logits=3)
    assert uniform_query_len(step_of_chunks([decode, verify], BLOCK_SIZE)) == 4  # 3 tokens: the bucket of 4
    assert uniform_query_len(step_of_chunks([SeqChunk([5, 6], 0, [3], num_logits=1)], BLOCK_SIZE)) is None
    default = CompilationConfig().capture_sizes(64)  # 1, 2, 4, 8, 16, 24, 32, 48, 64
    assert [bucket_for(n, default) for n in (1, 3, 5, 9, 64, 65)] == [1, 4, 8, 16, 64, None]
    # vLLM's cudagraph_capture_sizes name the buckets; none past max_cudagraph_capture_size or max_num_seqs
    sized = CompilationConfig(cudagraph_capture_sizes=[8, 1, 3], max_cudagraph_capture_size=8)
    assert sized.capture_sizes(64) == (1, 3, 8) and sized.capture_sizes(4) == (1, 3)
    assert [bucket_for(n, sized.capture_sizes(64)) for n in (1, 2, 3, 4, 8, 9)] == [1, 3, 3, 8, 8, None]
    assert CompilationConfig(max_cudagraph_capture_size=20).capture_sizes(256)[-1] == 16


def test_padding_writes_only_the_scratch_block() -> None:
    """A 1-token request padded to q = 3 writes its own slot, then two scratch slots; a padding request
    writes scratch slots only; real queries' contexts end where they did (seq_len = start + q, causal); only
    the real token stores a state (slot -1 elsewhere)."""
    chunk = SeqChunk([9], 5, [2, 7], state_slot=6)
    step = pad_step(step_of_chunks([chunk], 4), batch=2, query_len=3, scratch_block=10)
    assert step.slot_mapping.ravel().tolist() == [
        7 * 4 + 1,
        40,
        40,
        40,
        41,
        42,
    ]  # position 5: block 7, offset 1
    assert step.positions.ravel().tolist() == [5, 5, 5, 0, 1, 2]
    assert step.seq_lens.tolist() == [8, 3] and step.logits_rows.tolist() == [0]
    assert step.block_tables.tolist() == [[2, 7], [10, 10]]  # the 2 columns positions 0..7 need
    # a hybrid model's state: the chunk reads and writes its slot; padding reads zeros and stores nothing
    assert step.state_read is not None and step.state_write is not None
    assert step.state_read.tolist() == [6, -1]
    assert step.state_write.tolist() == [[6, -1, -1], [-1, -1, -1]]


@pytest.fixture(scope="module")
def moe_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_moe_checkpoint(tmp_path_factory.mktemp("moe") / "t", seed=3)


@pytest.fixture(scope="module")
def qwen3_5_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "t", seed=3, layout="causal_lm")


@pytest.mark.parametrize(
    ("model", "backend"),
    [
        ("target", "torch"),
        ("target", "triton"),
        ("moe_target", "torch"),
        ("qwen3_5_target", "torch"),
        ("qwen3_5_target", "triton"),
    ],
)
def test_padded_steps_give_the_same_logits(model: str, backend: str, request: pytest.FixtureRequest) -> None:
    """Prefill three prompts, then decode and verify-shaped steps of mixed lengths: the padded path's
    logits and aux hidden states equal the eager path's, and the real KV blocks end up the same. With the
    Triton kernels (under the interpreter on the CPU) the padded step is the one graphs replay on CUDA; on
    a Qwen3-MoE target the padding tokens are routed to experts too, and must change no real token's output;
    on a Qwen3.5 target every DeltaNet state slot ends up the same too (padding stores none; each shape's
    first use warms up twice, storing only into the scratch slot, though a decode reads and writes one)."""
    target: Path = request.getfixturevalue(model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    eager, pad = (
        ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE, torch.float32, name, True, state_geometry=STATES)
        for name in ("torch", backend)
    )
    assert_steps_agree(eager, padded(pad), hybrid=model == "qwen3_5_target")


def assert_steps_agree(eager: ModelRunner, pad: ModelRunner, hybrid: bool) -> None:
    """Three prompts' prefill, then decode, verify and decode steps (a hybrid's read the kept states): the
    logits, aux hidden states, KV blocks and a hybrid's states of ``pad`` are ``eager``'s."""
    prompts = [list(range(3, 12)), [40, 41], list(range(100, 117))]
    tables = [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    slots = [GROUP * b if hybrid else None for b in range(3)]  # read and written: slot 0 of each group
    prefill = [SeqChunk(p, 0, t, state_slot=s) for p, t, s in zip(prompts, tables, slots, strict=True)]
    for runner in (eager, pad):
        runner.execute(chunk_step(prefill, runner))  # not uniform: eager on both
    steps = [
        ([SeqChunk([7], 9, tables[0]), SeqChunk([8], 2, tables[1]), SeqChunk([9], 17, tables[2])], None),
        (  # a verification: every token's state kept
            [
                SeqChunk([1, 2, 3], 10, tables[0], 3),
                SeqChunk([4], 3, tables[1]),
                SeqChunk([5, 6], 18, tables[2], 2),
            ],
            None,
        ),
        # then decodes from the states after 2, 1 and 2 of those tokens: slots 1, 0, 1 of the groups
        (
            [SeqChunk([11], 12, tables[0]), SeqChunk([12], 4, tables[1]), SeqChunk([13], 20, tables[2])],
            [1, 0, 1],
        ),
    ]
    for chunks, reads in steps:
        chunks = [replace(chunk, state_slot=slot) for chunk, slot in zip(chunks, slots, strict=True)]
        expected, got = (
            eager.execute(keep_states(chunk_step(chunks, eager), reads), [0, 1]),
            pad.execute(keep_states(chunk_step(chunks, pad), reads), [0, 1]),
        )
        assert expected.aux is not None and got.aux is not None
        torch.testing.assert_close(got.aux, expected.aux, atol=1e-5, rtol=1e-5)
        expected, got = expected.logits, got.logits
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()
    for eager_cache, pad_cache in zip(eager.kv_caches, pad.kv_caches, strict=True):
        torch.testing.assert_close(
            pad_cache[:, :NUM_BLOCKS], eager_cache[:, :NUM_BLOCKS], atol=1e-5, rtol=1e-5
        )
    if hybrid:
        assert_same_states(pad, eager)
    assert pad.step_graphs is not None and pad.step_graphs.num_runs == 3


@pytest.mark.parametrize("to_scratch", [True, False])
def test_warm_up_stores_no_state(
    qwen3_5_target: Path, to_scratch: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decodes that read and write one slot, padded to a bucket of their own size: the shape's first use
    runs the forward 1 + WARMUP_RUNS times (capture's sequence), yet every state slot ends up exactly as one
    eager step leaves it. Without the warm-up's state writes sent to the scratch slot the update lands three
    times, and the states differ (what this test catches)."""
    if not to_scratch:
        monkeypatch.setattr(StepGraphs, "_state_writes_to_scratch", lambda self, n: nullcontext())
    cpu = torch.device("cpu")
    eager, pad = (
        ModelRunner(qwen3_5_target, cpu, NUM_BLOCKS, BLOCK_SIZE, torch.float32, state_geometry=STATES)
        for _ in range(2)
    )
    pad = padded(pad)
    prefill = [SeqChunk([3, 4, 5], 0, [0], state_slot=0), SeqChunk([6, 7], 0, [1], state_slot=GROUP)]
    decode = [SeqChunk([8], 3, [0], state_slot=0), SeqChunk([9], 2, [1], state_slot=GROUP)]
    for runner in (eager, pad):
        runner.execute(chunk_step(prefill, runner))
    expected, got = eager.execute(chunk_step(decode, eager)), pad.execute(chunk_step(decode, pad))
    assert pad.step_graphs is not None and pad.step_graphs.num_runs == 1  # 2 requests: the bucket of 2, q = 1
    if to_scratch:
        assert torch.equal(got.logits, expected.logits)
        assert_same_states(pad, eager, exact=True)
    else:
        with pytest.raises(AssertionError):
            assert_same_states(pad, eager)


def run_core(target: Path, runner: ModelRunner, spec: DrafterSpec | None) -> list[list[int]]:
    config = EngineConfig(
        model_path=target,
        served_model_name="t",
        num_kv_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        speculative=spec,
    )
    core = EngineCore(config, runner)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], list(range(30, 41)), [9, 9, 9, 9]]
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work:
        for output in core.step():
            out[output.request_id] += output.new_token_ids
    return [out[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("method", [None, "ngram", "dflash"])
def test_engine_tokens_are_the_same_padded(target: Path, tmp_path: Path, method: str | None) -> None:
    """Greedy outputs through the engine core, with no drafter, n-gram and DFlash (which reads aux hidden
    states), are the same with padded steps as without."""
    spec = None
    if method == "ngram":
        spec = DrafterSpec("ngram", 3)
    elif method == "dflash":
        draft = make_tiny_dflash_checkpoint(
            tmp_path / "d", target, seed=1, block_size=4, target_layer_ids=(0,)
        )
        spec = DrafterSpec("dflash", 3, draft)
    device = torch.device("cpu")
    expected = run_core(target, ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE), spec)
    runner = padded(ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE))
    got = run_core(target, runner, spec)
    assert got == expected
    assert runner.step_graphs is not None and runner.step_graphs.num_runs >= 10  # most steps ran padded


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replay_gives_eager_tokens(target: Path) -> None:
    """On CUDA (Triton attention): the captured graphs give the eager tokens, with and without n-gram."""
    device = torch.device("cuda")
    for spec in (None, DrafterSpec("ngram", 3)):
        eager = run_core(
            target,
            ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE, torch.float32, enforce_eager=True),
            spec,
        )
        runner = ModelRunner(target, device, NUM_BLOCKS, BLOCK_SIZE, torch.float32)  # no bf16 near-ties
        assert runner.step_graphs is not None and runner.step_graphs.capture
        assert run_core(target, runner, spec) == eager


@pytest.fixture(scope="module")
def repetitive_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repetitive_qwen3_5_checkpoint(tmp_path_factory.mktemp("repetitive") / "t")


def hybrid_prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(1, REPETITIVE_VOCAB) for _ in range(n)] for n in (3, 9, 17, 30, 12, 6)]


def test_qwen3_5_spec_decode_is_lossless_padded(repetitive_target: Path) -> None:
    """Prompt lookup K=4 on the repeating Qwen3.5 target, its decodes and verifications padded (each keeps
    every token's state, the next step starts from the accepted one's), every acceptance length seen: the
    tokens of the eager run without a drafter."""
    expected = generate_greedy(make_core(repetitive_target), hybrid_prompts(), 30)
    core = make_core(repetitive_target, speculative=DrafterSpec("ngram", 4))
    assert isinstance(core.runner, ModelRunner)
    runner = padded(core.runner)
    assert generate_greedy(core, hybrid_prompts(), 30) == expected
    assert core.spec is not None and all(n > 0 for n in core.spec.counters.accepted_length_hist)
    assert runner.step_graphs is not None and runner.step_graphs.num_runs >= 20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qwen3_5_cuda_graph_replay_gives_eager_results(qwen3_5_target: Path, repetitive_target: Path) -> None:
    """On CUDA (Triton attention, float32): a Qwen3.5 target's decodes and verifications replayed from
    captured graphs give the eager logits and states; through the engine, with and without n-gram, the
    eager tokens."""
    cuda = torch.device("cuda")
    eager, graphs = (
        ModelRunner(
            qwen3_5_target,
            cuda,
            NUM_BLOCKS,
            BLOCK_SIZE,
            torch.float32,
            enforce_eager=flag,
            state_geometry=STATES,
        )
        for flag in (True, False)
    )
    assert graphs.step_graphs is not None and graphs.step_graphs.capture
    assert_steps_agree(eager, graphs, hybrid=True)
    options = {"device": "cuda", "dtype": ModelDtype.FLOAT32, "num_kv_blocks": 64}
    expected = generate_greedy(
        make_core(repetitive_target, enforce_eager=True, **options), hybrid_prompts(), 30
    )
    for spec in (None, DrafterSpec("ngram", 4)):
        core = make_core(repetitive_target, speculative=spec, **options)
        assert isinstance(core.runner, ModelRunner) and core.runner.step_graphs is not None
        assert generate_greedy(core, hybrid_prompts(), 30) == expected
        assert core.runner.step_graphs.num_runs >= 20
