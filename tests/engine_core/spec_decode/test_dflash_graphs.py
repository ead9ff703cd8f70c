"""Padded fixed-shape DFlash draft forwards (the shapes CUDA graphs replay) propose the eager path's drafts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.compilation_config import CompilationConfig
from openinfer.engine_core.models.block_attention import (
    cpu_block_attention,
    torch_block_attention,
    triton_block_attention,
)
from openinfer.engine_core.models.dflash_config import AnchorLayout
from openinfer.engine_core.models.dspark_heads import MarkovHeadType
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.dflash_graphs import pad_blocks
from openinfer.engine_core.spec_decode.drafter import ContextUpdate, DeviceQueries, DraftQuery, context_rows
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.runner_output import DeviceDrafts
from openinfer.engine_core.worker.step_graphs import StepGraphs

PAGE = 4
NUM_PAGES = 64
MAX_LEN = 64  # the step graphs' model length: block tables of ceil((64 + 33) / 4) = 25 columns
K = 4  # drafts per block: blocks of K + 1 = 5 slots (the checkpoint's block_size is 6)
CONTEXTS = [0, 1, 3, 4, 7, 12, 16, 21, 30, 37]  # one request each: empty, within a page, page boundaries
BATCHES = [[0], [1, 5, 9], [9, 8, 7, 6, 5], [2, 3, 4], list(range(10))]  # buckets 1, 4, 8, 4; 10 > 8: eager


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target") / "t", seed=4, overrides=SMALL_QWEN3)


def draft_checkpoint(folder: Path, target: Path, anchor: AnchorLayout = AnchorLayout.MASK_SLOTS) -> Path:
    return make_tiny_dflash_checkpoint(
        folder, target, seed=2, num_layers=2, block_size=6, target_layer_ids=(0, 1), anchor=anchor
    )


def make_drafter(
    target: Path, draft: Path, device: torch.device, backend: str, graphs: bool, max_batch: int = 8
) -> DFlashDrafter:
    """A drafter over a fresh float32 runner; with ``graphs``, the runner has step graphs (capturing on CUDA,
    padded eagerly on the CPU) of buckets up to ``max_batch`` and the drafter follows it."""
    runner = ModelRunner(target, device, NUM_PAGES, PAGE, torch.float32, backend, enforce_eager=True)
    if graphs:
        runner.step_graphs = StepGraphs(
            runner.model,
            runner.kv_caches,
            PAGE,
            NUM_PAGES,
            MAX_LEN,
            CompilationConfig().capture_sizes(max_batch),
            capture=device.type == "cuda",
        )
    return DFlashDrafter(draft, runner, num_spec_tokens=K)


def ask_on_device(
    drafter: DFlashDrafter, queries: list[DraftQuery], temperatures: list[float] | None = None
) -> DeviceDrafts:
    """The queries asked on the device, as the engine asks before its read-back; with ``temperatures``,
    query i draws with its own generator seeded i."""
    device = drafter.device

    def column(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    generators = None
    if temperatures is not None:
        generators = [torch.Generator(device).manual_seed(i) for i in range(len(queries))]
    asked = DeviceQueries(
        column([q.current_token for q in queries]),
        column([q.position for q in queries]),
        column([q.max_drafts for q in queries]),
        [q.block_ids for q in queries],
        None if temperatures is None else torch.tensor(temperatures, device=device),
        generators,  # type: ignore[arg-type]
    )
    return drafter.propose_on_device(asked)


def device_drafts(drafter: DFlashDrafter, queries: list[DraftQuery]) -> list[list[int]]:
    """The queries asked on the device, read back and cut to each query's max_drafts."""
    rows = ask_on_device(drafter, queries).draft_ids.tolist()
    return [row[: q.max_drafts] for row, q in zip(rows, queries, strict=True)]


def check_padded_drafts(
    eager: DFlashDrafter, padded: DFlashDrafter, batches: list[list[int]] = BATCHES
) -> list[list[int]]:
    """Ten requests over scattered pages, each drafter's cache full of different noise first (stale entries
    must never count): every batch gets the same drafts from both, max_drafts 1..K mixed (so block lengths
    differ within a batch); the padded drafter runs every batch that fits a bucket padded, the rest eagerly.
    Asked on the device (block lengths from device max_drafts), both give the same drafts again. Returns
    the requests' block tables."""
    pages = list(range(NUM_PAGES))
    random.Random(0).shuffle(pages)
    gen = torch.Generator().manual_seed(0)
    width = len(eager.aux_layer_ids) * eager.config.target_hidden_size
    tables, updates = [], []
    for context in CONTEXTS:
        tables.append([pages.pop() for _ in range(-(-(context + K + 1) // PAGE))])
        if context:
            updates.append(ContextUpdate(tables[-1], 0, torch.randn(context, width, generator=gen)))
    for seed, drafter in enumerate((eager, padded)):
        for cache in drafter.context_caches:
            cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(seed)))
        drafter.extend_context(context_rows(updates, drafter.page_size))
    assert padded.graphs is not None
    runs = padded.graphs.num_runs
    for batch in batches:
        queries = [DraftQuery((7 * i + 3) % 256, CONTEXTS[i], tables[i], i % K + 1) for i in batch]
        expected = eager.propose(queries)
        assert padded.propose(queries) == expected, f"batch {batch}"
        assert [len(d) for d in expected] == [i % K + 1 for i in batch]
        assert device_drafts(eager, queries) == expected, f"batch {batch}, eagerly on the device"
        assert device_drafts(padded, queries) == expected, f"batch {batch}, padded on the device"
    fitting = [b for b in batches if len(b) <= padded.graphs.max_batch]
    # each fitting batch ran padded twice: from host queries, then from device ones
    assert padded.graphs.num_runs == runs + 2 * len(fitting) and len(fitting) < len(batches)
    return tables


def test_pad_blocks() -> None:
    """Two queries padded to a bucket of 4: padding rows hold token 0 at position 0 with an empty context and
    a full block of T = 5; tables keep the columns the contexts use (position 5 of pages of 4: 2)."""
    queries = [DraftQuery(11, 5, [3, 8, 2], 2), DraftQuery(12, 0, [], 4)]
    blocks = pad_blocks(queries, [4, 5], batch=4, block_width=5, page_size=4)
    assert blocks.rows == [[11, 12, 0, 0], [5, 0, 0, 0], [4, 5, 5, 5]]
    assert blocks.block_tables == [[3, 8], [0, 0], [0, 0], [0, 0]]


@pytest.mark.parametrize("anchor", list(AnchorLayout), ids=lambda a: a.value)
def test_padded_drafts_equal_eager(target: Path, tmp_path: Path, anchor: AnchorLayout) -> None:
    """The padded static path (torch attention, capture=False) proposes exactly the eager path's drafts, with
    either anchor layout (draft slots 1..K or 0..K-1)."""
    draft = draft_checkpoint(tmp_path, target, anchor)
    cpu = torch.device("cpu")
    eager = make_drafter(target, draft, cpu, "torch", graphs=False)
    padded = make_drafter(target, draft, cpu, "torch", graphs=True)
    assert eager.graphs is None and padded.graphs is not None and not padded.graphs.capture
    check_padded_drafts(eager, padded)


def check_dspark_graphs(target: Path, folder: Path, device: torch.device, backend: str) -> None:
    """A DSpark drafter (DeepSpec's layout: whole 6-slot blocks, the rnn Markov head drafting slot by slot
    inside the padded forward, a confidence head): padded (captured on CUDA), its drafts are the eager
    path's, and so are the confidences it returns with them on the device, greedy and sampled."""
    draft = make_tiny_dspark_checkpoint(
        folder, target, seed=3, num_layers=2, block_size=6, target_layer_ids=(0, 1), markov_rank=8,
        markov_head_type=MarkovHeadType.RNN, init_std=0.3,
    )  # fmt: skip
    eager = make_drafter(target, draft, device, backend, graphs=False)
    padded = make_drafter(target, draft, device, backend, graphs=True)
    assert eager.estimates_confidence and padded.graphs is not None
    assert padded.graphs.capture == (device.type == "cuda")
    tables = check_padded_drafts(eager, padded)
    for batch in ([1, 5, 9], list(range(10))):  # a bucket of 4, and 10 past the buckets (eager)
        queries = [DraftQuery(3 * i + 1, CONTEXTS[i], tables[i], K) for i in batch]
        want, got = ask_on_device(eager, queries), ask_on_device(padded, queries)
        assert want.confidence is not None and got.confidence is not None
        assert torch.equal(want.draft_ids, got.draft_ids)
        torch.testing.assert_close(got.confidence, want.confidence)
        assert float(got.confidence.std()) > 0.1  # rated apart, not saturated alike
    # Sampled drafting (greedy rows beside rows at T > 0, each drawing with its own seeded generator): padded
    # (from a second graph per bucket), the draws, the distributions they were drawn from and the confidences
    # are the eager path's; the greedy rows' drafts are the greedy ones, the rows at T = 1 not all.
    for batch in ([1, 5, 9], list(range(10))):
        queries = [DraftQuery(3 * i + 1, CONTEXTS[i], tables[i], K) for i in batch]
        temperatures = [(0.0, 0.7, 1.0)[i % 3] for i in batch]
        runs = padded.graphs.num_runs
        want, got = ask_on_device(eager, queries, temperatures), ask_on_device(padded, queries, temperatures)
        assert padded.graphs.num_runs == runs + (len(batch) <= padded.graphs.max_batch)
        assert want.probs is not None and got.probs is not None and got.confidence is not None
        assert torch.equal(want.draft_ids, got.draft_ids)
        torch.testing.assert_close(got.probs, want.probs)
        torch.testing.assert_close(got.confidence, want.confidence)
        greedy = ask_on_device(eager, queries).draft_ids
        cold = [b for b, t in enumerate(temperatures) if t == 0.0]
        hot = [b for b, t in enumerate(temperatures) if t == 1.0]
        assert torch.equal(got.draft_ids[cold], greedy[cold]) and not torch.equal(
            got.draft_ids[hot], greedy[hot]
        )


def test_padded_dspark_drafts_and_confidences_equal_eager(target: Path, tmp_path: Path) -> None:
    """DSpark's padded static path on the CPU (torch attention) drafts and rates as its eager path."""
    check_dspark_graphs(target, tmp_path, torch.device("cpu"), "torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_dspark_drafts_and_confidences_equal_eager(target: Path, tmp_path: Path) -> None:
    """On CUDA: DSpark's drafts and confidences replayed from captured graphs (Triton block attention) are
    the eager path's."""
    check_dspark_graphs(target, tmp_path, torch.device("cuda"), "triton")


def test_triton_padded_drafts_equal_eager(target: Path, tmp_path: Path) -> None:
    """A runner on the Triton backend gives its drafter the Triton block kernel (on the torch backend the
    CPU's in-place one, torch's SDPA on CUDA): padded (a bucket of 4) and eagerly (5 requests) through it,
    under the interpreter on the CPU, the drafts are the torch backend's eager path's."""
    draft = draft_checkpoint(tmp_path, target)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    eager = make_drafter(target, draft, device, "torch", graphs=False)
    padded = make_drafter(target, draft, device, "triton", graphs=True, max_batch=4)
    expected = cpu_block_attention if device.type == "cpu" else torch_block_attention
    assert eager.model.layers[0].self_attn.attention is expected
    assert padded.model.layers[0].self_attn.attention is triton_block_attention
    check_padded_drafts(eager, padded, [[1, 5, 9], [9, 8, 7, 6, 5]])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_drafts_equal_eager(target: Path, tmp_path: Path) -> None:
    """On CUDA: drafts replayed from captured graphs (one per bucket, replayed again with new inputs) equal the
    eager drafts; a runner with --enforce-eager gives its drafter no graphs."""
    draft = draft_checkpoint(tmp_path, target)
    device = torch.device("cuda")
    eager = make_drafter(target, draft, device, "triton", graphs=False)
    graphed = make_drafter(target, draft, device, "triton", graphs=True)
    assert eager.graphs is None and graphed.graphs is not None and graphed.graphs.capture
    check_padded_drafts(eager, graphed)
    runner = ModelRunner(target, device, NUM_PAGES, PAGE, torch.float32)  # auto: Triton, graphs on
    assert runner.step_graphs is not None
    assert DFlashDrafter(draft, runner, num_spec_tokens=K).graphs is not None
