"""DSpark's drafts: greedy ones equal a plain-torch block with PyPI speculators' Markov bias slot by slot;
sampled ones (temperature > 0) are drawn from distributions equal to that block's softmax given the drawn
prefix, and come back with them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from openinfer.engine_core.models.dspark_heads import MarkovHeadType
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.drafter import ContextUpdate, DeviceQueries, DraftQuery, context_rows
from openinfer.engine_core.testing.dspark_checkpoint import write_sampled_confidence
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.engine_core.worker.runner_output import DeviceDrafts
from tests.engine_core.spec_decode.plain_dflash import SMALL, WIDTH, reference_block_hidden
from tests.engine_core.spec_decode.tiny_dspark import (
    HEAD_TYPES,
    NUM_PAGES,
    PAGE,
    dspark_checkpoint,
    speculators_heads,
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target"), seed=1, overrides=SMALL)


@pytest.fixture(scope="module")
def runner(target: Path) -> ModelRunner:
    return ModelRunner(target, torch.device("cpu"), NUM_PAGES, PAGE)


@dataclass
class Blocks:
    """A DSpark drafter with two requests' contexts written (7 and 3 positions on scattered pages), their
    queries for K = 5 of a 6-slot block, and speculators' Markov head on the drafter's own weights."""

    drafter: DFlashDrafter
    theirs: nn.Module
    embed: Tensor
    head: Tensor
    weights: dict[str, Tensor]
    contexts: list[Tensor]
    tokens: list[int]
    queries: list[DraftQuery]

    def expected_hidden(self, b: int) -> Tensor:
        """(block_size, hidden): the plain-torch block of request b."""
        return reference_block_hidden(self.weights, self.embed, self.contexts[b], self.tokens[b], block=6)

    def expected_logits(self, b: int, prefix: list[int]) -> Tensor:
        """(vocab,): slot len(prefix)'s logits given the drafts before it, speculators' bias included."""
        hidden = self.expected_hidden(b)
        slot = len(prefix)
        prev = torch.tensor([[self.tokens[b], *prefix]])  # (1, slot + 1): the anchor, then the drafts
        bias = self.theirs.block_bias(prev_token_ids=prev, hidden_states=hidden[None, : slot + 1])
        return hidden[slot] @ self.head.T + bias[0, slot]


def dspark_blocks(
    head_type: MarkovHeadType, target: Path, runner: ModelRunner, folder: Path, k: int = 5
) -> Blocks:
    theirs_module = speculators_heads()
    drafter = DFlashDrafter(dspark_checkpoint(folder, target, head_type), runner, num_spec_tokens=k)
    weights = load_file(folder / "model.safetensors")
    theirs = theirs_module.MarkovHead(
        verifier_vocab_size=SMALL["vocab_size"],
        draft_vocab_size=SMALL["vocab_size"],
        markov_rank=8,
        hidden_size=64,
        head_type=head_type.value,
    )
    theirs.load_state_dict(
        {
            name.removeprefix("markov_head."): t
            for name, t in weights.items()
            if name.startswith("markov_head.")
        }
    )
    gen = torch.Generator().manual_seed(0)
    contexts = [torch.randn(7, WIDTH, generator=gen) * 2, torch.randn(3, WIDTH, generator=gen) * 2]
    tables = [[11, 3], [40]]  # pages of 4: 7 positions over pages 11 and 3, 3 positions in page 40
    updates = [ContextUpdate(t, 0, c) for t, c in zip(tables, contexts, strict=True)]
    drafter.extend_context(context_rows(updates, drafter.page_size))
    tokens = [17, 230]
    queries = [DraftQuery(tok, c.shape[0], t, k) for tok, c, t in zip(tokens, contexts, tables, strict=True)]
    embed, head = weights["embed_tokens.weight"], weights["lm_head.weight"]
    return Blocks(drafter, theirs, embed, head, weights, contexts, tokens, queries)


def ask_on_device(
    drafter: DFlashDrafter,
    queries: list[DraftQuery],
    temperatures: list[float],
    generators: list[torch.Generator | None] | None = None,
) -> DeviceDrafts:
    """`propose_on_device` for `queries` at these temperatures."""
    column = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
    return drafter.propose_on_device(
        DeviceQueries(
            column([q.current_token for q in queries]),
            column([q.position for q in queries]),
            column([q.max_drafts for q in queries]),
            [q.block_ids for q in queries],
            torch.tensor(temperatures),
            generators,
        )
    )


@pytest.mark.parametrize("head_type", HEAD_TYPES, ids=lambda t: t.value)
def test_drafts_match_reference(
    head_type: MarkovHeadType, target: Path, runner: ModelRunner, tmp_path: Path
) -> None:
    """Two requests (contexts of 7 and 3 positions on scattered pages), K = 5 of a 6-slot block: every greedy
    draft is the argmax of the plain-torch block's logits (all block_size slots, the current token then
    masks, as DeepSpec runs them whatever K) plus speculators' Markov bias given the current token and the
    drafts before it."""
    blocks = dspark_blocks(head_type, target, runner, tmp_path)
    got = blocks.drafter.propose(blocks.queries)
    for b, drafts in enumerate(got):
        expected: list[int] = []
        with torch.no_grad():
            for _ in range(5):
                expected.append(int(blocks.expected_logits(b, expected).argmax()))
        assert drafts == expected
    assert got[0] != got[1]


@pytest.mark.parametrize("head_type", HEAD_TYPES, ids=lambda t: t.value)
def test_sampled_drafts_and_their_distributions(
    head_type: MarkovHeadType, target: Path, runner: ModelRunner, tmp_path: Path
) -> None:
    """At temperature T > 0 each slot's draft is drawn from q_k = softmax(logits_k / T), the Markov bias
    reading the draft drawn before it; the drafter returns every q_k, equal to the plain-torch block with
    speculators' bias given the drawn prefix, and slot 0's draws follow q_0; a seeded request draws with its
    own generator. A request at T = 0 beside them drafts greedily with one-hot q; a tiny T draws the greedy
    drafts."""
    blocks = dspark_blocks(head_type, target, runner, tmp_path)
    greedy = blocks.drafter.propose(blocks.queries)

    def ask(
        temperatures: list[float], generators: list[torch.Generator | None] | None = None
    ) -> DeviceDrafts:
        return ask_on_device(blocks.drafter, blocks.queries, temperatures, generators)

    cold = ask([1e-4, 0.0])
    assert cold.probs is not None and cold.draft_ids.tolist() == greedy
    assert torch.equal(
        cold.probs[1], torch.nn.functional.one_hot(cold.draft_ids[1], SMALL["vocab_size"]).float()
    )
    temperature, firsts = 0.6, []
    for _ in range(200):
        hot = ask([temperature, temperature])
        assert hot.probs is not None
        firsts.append(int(hot.draft_ids[0, 0]))
    drafts = hot.draft_ids.tolist()
    with torch.no_grad():
        for b in range(2):
            for slot in range(5):
                expected = torch.softmax(blocks.expected_logits(b, drafts[b][:slot]) / temperature, dim=-1)
                torch.testing.assert_close(hot.probs[b, slot], expected, atol=1e-5, rtol=1e-4)
    assert drafts != greedy  # drawn, not the argmax
    # A seeded request draws with its own generator: the same drafts whatever the drafter drew before.
    seeded = [ask([temperature, temperature], [torch.Generator().manual_seed(5), None]) for _ in range(2)]
    assert torch.equal(seeded[0].draft_ids[0], seeded[1].draft_ids[0])
    # Drawn from q_0, a draft's own probability averages sum(q_0^2) (uniform draws would average 1 / vocab).
    q0 = hot.probs[0, 0]
    mean_own = q0[torch.tensor(firsts)].mean().item()
    assert abs(mean_own / (q0 * q0).sum().item() - 1) < 0.3 and (q0 * q0).sum() > 3 / q0.shape[0]


def test_sampled_rows_read_the_sampled_head(target: Path, runner: ModelRunner, tmp_path: Path) -> None:
    """A folder with a sampled confidence head (`sampled_confidence_temperature`): in one batch, the row drawn
    at T > 0 takes that head's confidences and the greedy row the greedy head's. The sampled head here is the
    greedy one with its bias raised by 1.5, so each sampled-row confidence is sigmoid(logit(greedy's) + 1.5);
    a seeded generator draws the same drafts from both drafters (a confidence never changes a draft)."""
    blocks = dspark_blocks(MarkovHeadType.VANILLA, target, runner, tmp_path)
    seeded = lambda: [None, torch.Generator().manual_seed(3)]  # noqa: E731
    before = ask_on_device(blocks.drafter, blocks.queries, [0.0, 0.7], seeded())
    head = blocks.drafter.model.confidence_head
    assert head is not None and blocks.drafter.model.sampled_confidence_head is None
    write_sampled_confidence(tmp_path, 0.7, head.proj.weight, head.proj.bias + 1.5)
    drafter = DFlashDrafter(tmp_path, runner, num_spec_tokens=5)
    assert drafter.model.sampled_confidence_head is not None
    updates = [ContextUpdate(q.block_ids, 0, c) for q, c in zip(blocks.queries, blocks.contexts, strict=True)]
    drafter.extend_context(context_rows(updates, drafter.page_size))
    after = ask_on_device(drafter, blocks.queries, [0.0, 0.7], seeded())
    assert before.confidence is not None and after.confidence is not None
    assert torch.equal(after.draft_ids, before.draft_ids)
    torch.testing.assert_close(after.confidence[0], before.confidence[0])
    expected = torch.sigmoid(torch.logit(before.confidence[1].double()) + 1.5).float()
    torch.testing.assert_close(after.confidence[1], expected, atol=1e-5, rtol=1e-4)
    assert bool((after.confidence[1] > before.confidence[1]).all())
