"""DSpark (DeepSpec's layout): its heads equal PyPI speculators' on the same weights, its greedy drafts equal a
plain-torch block with speculators' Markov bias applied slot by slot, it serves losslessly, and its rounds
(with and without a confidence threshold) equal an independent batch-1 loop of DeepSpec's algorithm."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
from openinfer.engine_core.models.dspark_heads import ConfidenceHead, MarkovHead, MarkovHeadType
from openinfer.engine_core.testing.deepspec_reference import DeepSpecReference, Round
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.engine_cores import CheckedSteps, make_core
from openinfer.engine_core.testing.spec_logs import read_spec_log
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.protocol import EngineCoreRequest, SamplingParams, SpecDecodeCounters
from tests.engine_core.spec_decode.plain_dflash import SMALL
from tests.engine_core.spec_decode.tiny_dspark import (
    HEAD_TYPES,
    NUM_PAGES,
    PAGE,
    dspark_checkpoint,
    speculators_heads,
)


def stepped_bias(head: MarkovHead, prev: Tensor, hidden: Tensor) -> Tensor:
    """(N, W, vocab): our head's bias slot by slot from prev (N, W) and hidden (N, W, d)."""
    state = head.initial_state(prev.shape[0], hidden)
    biases = []
    for k in range(prev.shape[1]):
        bias, state = head.step(head.embed(prev[:, k]), hidden[:, k], state)
        biases.append(bias)
    return torch.stack(biases, dim=1)


@pytest.mark.parametrize("head_type", HEAD_TYPES, ids=lambda t: t.value)
def test_markov_head_matches_speculators(head_type: MarkovHeadType) -> None:
    """The same weights (speculators' random init) give speculators' `block_bias` when our head steps slot
    by slot through the block (the rnn head carrying its state from zero)."""
    theirs_module = speculators_heads()
    torch.manual_seed(0)
    vocab, rank, hidden_size = 50, 8, 16
    theirs = theirs_module.MarkovHead(
        verifier_vocab_size=vocab,
        draft_vocab_size=vocab,
        markov_rank=rank,
        hidden_size=hidden_size,
        head_type=head_type.value,
    )
    for param in theirs.parameters():  # speculators' init leaves markov_w2 tiny; spread every weight out
        nn.init.normal_(param, std=0.5)
    ours = MarkovHead(vocab, rank, hidden_size, head_type)
    ours.load_state_dict(theirs.state_dict())  # same names: markov_w1, markov_w2, gate_proj / joint_proj
    prev = torch.randint(0, vocab, (3, 5))  # (N blocks, W slots)
    hidden = torch.randn(3, 5, hidden_size)
    with torch.no_grad():
        expected = theirs.block_bias(prev_token_ids=prev, hidden_states=hidden)
        got = stepped_bias(ours, prev, hidden)
    assert got.shape == (3, 5, vocab)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("with_markov", [True, False], ids=["with-markov", "hidden-only"])
def test_confidence_head_matches_speculators(with_markov: bool) -> None:
    """Our confidence is the sigmoid of speculators' ConfidenceHead logit on [h; markov_w1[prev]] (or h)."""
    theirs_module = speculators_heads()
    torch.manual_seed(1)
    rank, hidden_size = 8, 16
    theirs = theirs_module.ConfidenceHead(hidden_size + (rank if with_markov else 0))
    ours = ConfidenceHead(hidden_size, rank, with_markov)
    ours.load_state_dict(theirs.state_dict())
    hidden, prev_embed = torch.randn(6, hidden_size), torch.randn(6, rank)
    features = torch.cat((hidden, prev_embed), dim=-1) if with_markov else hidden
    with torch.no_grad():
        expected = torch.sigmoid(theirs(features))
        got = ours(hidden, prev_embed if with_markov else None)
    assert got.dtype == torch.float32 and got.shape == (6,)
    torch.testing.assert_close(got, expected)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target"), seed=1, overrides=SMALL)


@pytest.fixture(scope="module")
def runner(target: Path) -> ModelRunner:
    return ModelRunner(target, torch.device("cpu"), NUM_PAGES, PAGE)


def test_deepspec_config_is_read(target: Path, tmp_path: Path) -> None:
    """A Qwen3DSparkModel config: the anchor is the first prediction (block_size drafts), the heads are
    those its fields name; DeepSpec's DFlash (markov_rank 0, no confidence head) has none."""
    config = DFlashConfig.from_folder(dspark_checkpoint(tmp_path / "s", target, MarkovHeadType.RNN))
    assert config.anchor is AnchorLayout.ANCHOR_SLOT and config.max_drafts == 6
    assert config.heads is not None and config.heads.markov_rank == 8
    assert config.heads.markov_head_type is MarkovHeadType.RNN and config.heads.confidence_with_markov
    plain = make_tiny_dspark_checkpoint(
        tmp_path / "d", target, num_layers=1, markov_rank=0, confidence_head=False
    )
    config = DFlashConfig.from_folder(plain)
    assert config.is_deepspec and config.heads is not None
    assert config.heads.markov_rank == 0 and not config.heads.confidence_head
    assert config.anchor is AnchorLayout.ANCHOR_SLOT


@pytest.mark.parametrize("head_type", HEAD_TYPES, ids=lambda t: t.value)
def test_serving_is_lossless(head_type: MarkovHeadType, target: Path, tmp_path: Path) -> None:
    """Greedy requests served with the DSpark drafter (K = 6 = block_size) produce the tokens of the same
    requests served without one, and the drafter's rounds are counted."""
    folder = dspark_checkpoint(tmp_path, target, head_type)
    prompts = [[5, 9, 200, 31, 7], [100, 101, 102, 103], list(range(40, 70))]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    def serve(spec: DrafterSpec | None) -> tuple[list[list[int]], int]:
        core = make_core(target)
        if spec is not None:
            core.load_drafter(spec)
        for i, prompt in enumerate(prompts):
            core.add_request(EngineCoreRequest(f"r{i}", prompt, params))
        out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
        steps = CheckedSteps(core)
        while core.has_work:
            for output in steps.step():
                out[output.request_id].extend(output.new_token_ids)
        assert steps.snapshots > 0 or spec is None
        drafts = core.spec.counters.num_drafts if core.spec is not None else 0
        return list(out.values()), drafts

    plain, _ = serve(None)
    speculated, num_drafts = serve(DrafterSpec("dspark", 6, draft_model=folder))
    assert speculated == plain
    assert num_drafts > 0


def bigram_dspark(folder: Path, successors: dict[int, int], head_type: MarkovHeadType) -> None:
    """Rewrite the Markov head of a drafter whose markov_rank is the vocabulary so that its bias drafts the
    successor of the token before each slot (markov_w1 the identity, markov_w2 the successor table; the rnn
    head's output gate reads markov_w1[prev] alone): a drafter the target accepts, sometimes."""
    path = folder / "model.safetensors"
    weights = load_file(path)
    vocab = SMALL["vocab_size"]
    weights["markov_head.markov_w1.weight"] = torch.eye(vocab)
    table = torch.zeros(vocab, vocab)
    for prev, nxt in successors.items():
        table[nxt, prev] = 8.0
    weights["markov_head.markov_w2.weight"] = table
    if head_type is MarkovHeadType.RNN:
        joint = weights["markov_head.joint_proj.weight"]  # (3r, 2r + hidden): rows [gate; candidate; output]
        joint[2 * vocab :] = 0.0
        joint[2 * vocab :, vocab : 2 * vocab] = 4.0 * torch.eye(vocab)
        weights["markov_head.joint_proj.bias"][2 * vocab :] = 0.0
    save_file(weights, path)


def expected_counters(rounds: list[Round], k: int) -> SpecDecodeCounters:
    """The counters docs/design.md gives for these rounds, written out field by field (not through observe_*); a
    round's confidences count at the positions it reached (verified, every draft before accepted)."""
    drafts = [r for r in rounds if r.verified]
    micros = [0] * k
    for r in drafts:
        for i in range(min(r.accepted + 1, r.verified)):
            micros[i] += round(r.confidence[i] * 1_000_000)
    return SpecDecodeCounters(
        num_spec_tokens=k,
        num_drafts=len(drafts),
        num_draft_tokens=sum(r.verified for r in drafts),
        num_accepted_tokens=sum(r.accepted for r in drafts),
        num_accepted_tokens_per_pos=[sum(r.accepted > i for r in drafts) for i in range(k)],
        accepted_length_hist=[sum(r.accepted == n for r in drafts) for n in range(k + 1)],
        num_draft_tokens_per_pos=[sum(r.verified > i for r in drafts) for i in range(k)],
        num_unverified_draft_tokens=sum(r.proposed - r.verified for r in rounds),
        num_reached_per_pos=[sum(r.verified > i and r.accepted >= i for r in drafts) for i in range(k)],
        confidence_micros_per_pos=micros,
    )


@pytest.mark.parametrize(
    ("head_type", "threshold"),
    [(MarkovHeadType.VANILLA, 0.0), (MarkovHeadType.VANILLA, 0.5), (MarkovHeadType.GATED, 0.4),
     (MarkovHeadType.RNN, 0.6)],
    ids=lambda v: getattr(v, "value", v),
)  # fmt: skip
def test_rounds_match_deepspec_loop(
    head_type: MarkovHeadType, threshold: float, target: Path, tmp_path: Path
) -> None:
    """Three greedy requests served together (K = block_size = 6, --confidence-threshold as given): every
    request's tokens and every round's proposed, verified and accepted counts equal an independent batch-1
    loop of DeepSpec's algorithm (z-lab's DFlash forward for the backbone, speculators' heads), and the
    engine's counters are docs/design.md's for those rounds, unverified drafts apart from rejected ones."""
    heads = speculators_heads()
    pytest.importorskip("dflash")
    k = 6
    folder = dspark_checkpoint(tmp_path / "drafter", target, head_type, markov_rank=SMALL["vocab_size"])
    prompts = [[5, 9, 200, 31, 7], [100, 101, 102, 103], list(range(40, 70))]
    max_tokens = [30, 17, 24]
    # The target's greedy continuations (any drafter's, lossless) give the Markov head its successor table.
    plain = DeepSpecReference(target, folder, heads)
    greedy = [[*p, *plain.run(p, n, k, 0.0).tokens] for p, n in zip(prompts, max_tokens, strict=True)]
    bigram_dspark(folder, {a: b for seq in greedy for a, b in itertools.pairwise(seq)}, head_type)
    reference = DeepSpecReference(target, folder, heads)
    expected = [reference.run(p, n, k, threshold) for p, n in zip(prompts, max_tokens, strict=True)]
    rounds = [r for run in expected for r in run.rounds]
    assert sum(r.accepted for r in rounds) > 10 and any(r.accepted < r.verified for r in rounds)
    if threshold:  # the rule cut some rounds short and left some unverified
        assert any(0 < r.verified < r.proposed for r in rounds) and any(r.verified == 0 for r in rounds)
    else:
        assert all(r.verified == r.proposed for r in rounds)
    log = tmp_path / "spec.jsonl"
    core = make_core(target, spec_log=log)
    core.load_drafter(DrafterSpec("dspark", k, folder, confidence_threshold=threshold))
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in max_tokens]
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        core.add_request(EngineCoreRequest(str(i), prompt, p))
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    steps = CheckedSteps(core)  # docs/design.md's invariants on every snapshot, not only the last
    while core.has_work:
        for output in steps.step():
            tokens[output.request_id].extend(output.new_token_ids)
    assert steps.snapshots >= max(len(run.rounds) for run in expected)
    lines = read_spec_log(log)
    for i, run in enumerate(expected):
        assert tokens[str(i)] == run.tokens, f"request {i}"
        mine = [
            (x["num_proposed_tokens"], x["num_draft_tokens"], x["num_accepted"])
            for x in lines
            if x["request_id"] == str(i)
        ]
        assert mine == [(r.proposed, r.verified, r.accepted) for r in run.rounds], f"request {i}"
    assert core.spec is not None
    assert core.spec.counters.violation() is None
    counters, expected = core.spec.counters.copy(), expected_counters(rounds, k)
    # The confidences are the reference's to float rounding: a micro apart at most per draft that counts.
    for got, want, reached in zip(
        counters.confidence_micros_per_pos,
        expected.confidence_micros_per_pos,
        expected.num_reached_per_pos,
        strict=True,
    ):
        assert abs(got - want) <= reached
    counters.confidence_micros_per_pos = expected.confidence_micros_per_pos = []
    assert counters == expected


def test_the_method_must_fit_the_checkpoint(target: Path, tmp_path: Path) -> None:
    """dflash refuses a DSpark checkpoint and dspark a checkpoint without heads, each naming the other;
    --confidence-threshold needs a confidence head."""
    core = make_core(target)
    dspark = dspark_checkpoint(tmp_path / "s", target, MarkovHeadType.VANILLA)
    with pytest.raises(ValueError, match="serve it with --spec-method dspark"):
        core.load_drafter(DrafterSpec("dflash", 6, dspark))
    plain = make_tiny_dspark_checkpoint(
        tmp_path / "d", target, num_layers=1, markov_rank=0, confidence_head=False
    )
    with pytest.raises(ValueError, match="--spec-method dflash"):
        core.load_drafter(DrafterSpec("dspark", 6, plain))
    core.load_drafter(DrafterSpec("dflash", 6, plain))  # DeepSpec's DFlash drafter
    blind = make_tiny_dspark_checkpoint(tmp_path / "b", target, num_layers=1, confidence_head=False)
    with pytest.raises(ValueError, match="needs a confidence head"):
        core.load_drafter(DrafterSpec("dspark", 6, blind, confidence_threshold=0.5))
    core.load_drafter(DrafterSpec("dspark", 6, blind))
    assert core.spec is not None and core.spec.describe().startswith("dspark K=6")
