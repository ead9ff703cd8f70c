"""DFlash against z-lab's own reference (PyPI `dflash`, `dflash/model.py`): the same checkpoints loaded by both,
greedy; every round's accepted count and every token equal, and the drafter's logits for a block equal.
The harness, and the one documented difference (no draft for a request's last token), is
`openinfer.engine_core.testing.zlab_reference`."""

from __future__ import annotations

import json
from pathlib import Path

import dflash.model as zlab
import pytest
import torch
from tokenizers import Tokenizer

from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.drafter import ContextUpdate, DraftQuery, context_rows
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.testing.zlab_reference import load_reference, openinfer_runs, reference_runs
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.kernels.attention_metadata import AttentionMetadata

# 6 target layers, z-lab's shape in small: the drafter reads layers 1, 2 and 5 (5 is the last: transformers'
# hidden state there follows the final norm, which both sides must agree on).
TARGET = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
LAYER_IDS = (1, 2, 5)
# With a 64-token step budget the 70-token prompt is prefilled in three chunks while the others decode, and
# no draft (at most 4 x (1 + 15) tokens a step) is ever cut by the budget, which the reference has not.
PROMPT_LENGTHS = [1, 6, 17, 70]
STEP_BUDGET = 64
MAX_TOKENS = [23, 2, 31, 12]  # most cut the last block; 2 leaves a single draft-less token after the first


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A larger init makes the random target's greedy text vary instead of repeating one token.
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target"), seed=4, init_std=0.1, overrides=TARGET)


def prompts(seed: int, lengths: list[int] = PROMPT_LENGTHS, vocab: int = 512) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


def assert_same_rounds(
    target_folder: Path,
    draft_folder: Path,
    k: int,
    tmp_path: Path,
    batch: list[list[int]],
    max_tokens: list[int] = MAX_TOKENS,
) -> list[int]:
    """Tokens, accepted counts and draft lengths per round equal z-lab's for every prompt (batched in one
    engine, the longest prompt prefilled in chunks); returns every round's accepted count."""
    reference = reference_runs(target_folder, draft_folder, k, batch, max_tokens)
    ours = openinfer_runs(
        target_folder,
        draft_folder,
        k,
        batch,
        max_tokens,
        tmp_path / f"spec-{k}.jsonl",
        max_num_batched_tokens=STEP_BUDGET,
    )
    for i, (ref, mine) in enumerate(zip(reference, ours, strict=True)):
        assert mine.tokens == ref.tokens, f"prompt {i}: tokens differ"
        assert mine.rounds == ref.rounds, f"prompt {i}: accepted per round differ"
        assert mine.draft_lengths == ref.draft_lengths, f"prompt {i}: draft lengths differ"
    return [a for run in ours for a in run.rounds]


@pytest.mark.parametrize("k", [7, 3], ids=["K=block-1", "K<block-1"])
def test_random_drafter_rounds_equal_reference(target: Path, tmp_path: Path, k: int) -> None:
    """A random z-lab-layout drafter (block 8, 2 layers, no sample_from_anchor key as z-lab publishes):
    K = 7 is the whole block, K = 3 is the reference run with block_size 4."""
    draft = make_tiny_dflash_checkpoint(
        tmp_path / "draft",
        target,
        seed=3,
        num_layers=2,
        block_size=8,
        target_layer_ids=LAYER_IDS,
        anchor=None,
    )
    assert_same_rounds(target, draft, k, tmp_path, prompts(0))


def test_drafter_logits_equal_reference(target: Path, tmp_path: Path) -> None:
    """One block's draft logits (K = 7) from our paged drafter equal z-lab's DFlashDraftModel fed the
    transformers target's hidden states, to 1e-4 in float32; with z-lab's optional scales set."""
    draft = make_tiny_dflash_checkpoint(
        tmp_path / "draft",
        target,
        seed=5,
        num_layers=2,
        block_size=8,
        target_layer_ids=LAYER_IDS,
        anchor=None,
    )
    config = json.loads((draft / "config.json").read_text())
    config["dflash_config"].update(
        input_embedding_scale=0.5, output_multiplier=1.7, final_logit_softcapping=9.0
    )
    (draft / "config.json").write_text(json.dumps(config))
    prompt, current, k = (
        torch.randint(3, 512, (21,), generator=torch.Generator().manual_seed(1)).tolist(),
        77,
        7,
    )

    hf_target, reference = load_reference(target, draft)
    with torch.inference_mode():
        hidden_states = hf_target(torch.tensor([prompt]), output_hidden_states=True).hidden_states
        context = zlab.extract_context_feature(hidden_states, list(LAYER_IDS))  # (1, 21, 3 * 64)
        block = torch.tensor([[current] + [config["dflash_config"]["mask_token_id"]] * k])
        noise = zlab._raw_input_embeddings(hf_target, block, 0.5)
        out = reference(
            position_ids=torch.arange(len(prompt) + k + 1)[None],
            noise_embedding=noise,
            target_hidden=context,
        )
        expected = reference.compute_logits(out[:, 1:], hf_target.lm_head)[0]  # (7, vocab)

    runner = ModelRunner(target, torch.device("cpu"), num_kv_blocks=8, block_size=4)
    drafter = DFlashDrafter(draft, runner, num_spec_tokens=k)
    block_ids = [5, 0, 3, 7, 1, 2]  # scattered pages
    attn = AttentionMetadata.build([0], [len(prompt)], [block_ids], 4, runner.device)
    with torch.inference_mode():
        _, aux = runner.model.forward_with_aux(
            torch.tensor(prompt), torch.arange(len(prompt)), runner.kv_caches, attn, drafter.aux_layer_ids
        )
    drafter.extend_context(
        context_rows([ContextUpdate(block_ids, 0, torch.cat(aux, dim=-1))], drafter.page_size)
    )
    (got,) = drafter.draft_logits([DraftQuery(current, len(prompt), block_ids, k)])
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
    assert drafter.propose([DraftQuery(current, len(prompt), block_ids, k)]) == [expected.argmax(-1).tolist()]


@pytest.mark.parametrize("num_layers", [1, 5])
def test_zlab_shaped_config_rounds_equal_reference(tmp_path: Path, num_layers: int) -> None:
    """A z-lab Qwen3-8B-DFlash-b16-shaped config at small width: block_size 16 served at K = 15, five target
    layer ids over an 8-layer target (z-lab's own spread, from num_target_layers alone, for 5 draft layers;
    given explicitly for 1), mask_token_id past the tokenizer's 512 tokens but inside the 528-row embedding,
    no sample_from_anchor key; tokens and rounds equal the reference's."""
    target = make_tiny_checkpoint(
        tmp_path / "target",
        seed=6,
        init_std=0.1,
        overrides={**TARGET, "num_hidden_layers": 8, "vocab_size": 528},
    )
    draft = make_tiny_dflash_checkpoint(
        tmp_path / "draft",
        target,
        seed=7,
        num_layers=num_layers,
        block_size=16,
        target_layer_ids=(1, 2, 3, 5, 6),
        mask_token_id=520,
        anchor=None,
    )
    config = json.loads((draft / "config.json").read_text())
    if num_layers == 5:
        del config["dflash_config"][
            "target_layer_ids"
        ]  # z-lab's build_target_layer_ids(8, 5) = [1, 2, 3, 4, 5]
    (draft / "config.json").write_text(json.dumps(config))
    runner = ModelRunner(target, torch.device("cpu"), num_kv_blocks=8)
    drafter = DFlashDrafter(draft, runner, num_spec_tokens=15)
    expected_ids = (1, 2, 3, 4, 5) if num_layers == 5 else (1, 2, 3, 5, 6)
    assert drafter.aux_layer_ids == expected_ids and drafter.config.block_size == 16
    assert_same_rounds(target, draft, 15, tmp_path, prompts(2, vocab=528))


# Public-domain lines (Romeo and Juliet) as prompts for the built-in target, which was trained on Shakespeare.
LINES = [
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;",
    "MERCUTIO:\nNay, I am the very pink of courtesy.",
    "FRIAR LAURENCE:\nThese violent delights have violent ends\nAnd in their triumph die, like fire and powder,",
]


def test_trained_drafter_rounds_equal_reference(tmp_path: Path) -> None:
    """The built-in target with a drafter trained in z-lab's layout (tests/data/zlab_dflash, made by
    tools/train_dflash.py --anchor mask_slots): long accepted runs, cut blocks with acceptance; every round
    equal to the reference's, at K = 7 and at K = 4."""
    target, draft = builtin_target_folder(), Path(__file__).parents[2] / "data" / "zlab_dflash"
    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    batch = [tokenizer.encode(line).ids for line in LINES]
    for k in (7, 4):
        accepted = assert_same_rounds(target, draft, k, tmp_path, batch, [40, 25, 33, 47])
        assert sum(accepted) / len(accepted) > 1.5 and 0 in accepted and k in accepted  # real, partial
