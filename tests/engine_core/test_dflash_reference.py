"""DFlash against z-lab's own reference (PyPI `dflash`, `dflash/model.py`): the same checkpoints loaded by both,
greedy; every round's accepted count and every token equal, and the drafter's logits for a block equal.

z-lab's `dflash_generate(block_size=n)` verifies n tokens a round: the current one and n - 1 drafts, the last
block cut to the tokens left (`max_length - start`). Its `acceptance_lengths` counts the tokens a round
produced, so a round's accepted drafts are `acceptance_length - 1`. One documented difference: when a single
token is left, the reference still drafts one token whose fate cannot change the output, since that token is
the last; openinfer's drafts never run past max_tokens (DESIGN.md), so it makes no draft there and decodes
that token normally. `reference_rounds` drops exactly those rounds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import dflash.model as zlab
import pytest
import torch
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.engine_core import EngineCore
from openinfer.engine_core.model_runner import ModelRunner
from openinfer.engine_core.models.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.drafter import ContextUpdate, DraftQuery
from openinfer.engine_core.spec_decode.spec_decoder import DrafterSpec
from openinfer.engine_core.tiny_model import make_tiny_checkpoint
from openinfer.kernels.attention import AttentionMetadata
from openinfer.protocol import EngineCoreRequest, SamplingParams

# Its stats timer calls torch.cuda.synchronize(); on the CPU a plain clock does.
zlab._cuda_time = time.perf_counter  # type: ignore[attr-defined]

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
PROMPT_LENGTHS = [1, 6, 17, 40]
MAX_TOKENS = [23, 2, 31, 12]  # most cut the last block; 2 leaves a single draft-less token after the first


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A larger init makes the random target's greedy text vary instead of repeating one token.
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target"), seed=4, init_std=0.1, overrides=TARGET)


def prompts(seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def load_reference(target_folder: Path, draft_folder: Path) -> tuple[Qwen3ForCausalLM, zlab.DFlashDraftModel]:
    target = Qwen3ForCausalLM.from_pretrained(target_folder, dtype=torch.float32).eval()
    draft = zlab.DFlashDraftModel.from_pretrained(draft_folder, dtype=torch.float32).eval()
    return target, draft


def reference_rounds(result: SimpleNamespace, max_tokens: int) -> list[int]:
    """Accepted drafts per round of a dflash_generate result, without the single-token-left rounds."""
    max_length = result.num_input_tokens + max_tokens
    start, rounds = result.num_input_tokens, []
    for produced in result.acceptance_lengths:
        if max_length - start > 2:
            rounds.append(produced - 1)
        start += produced
    return rounds


def run_reference(
    target_folder: Path, draft_folder: Path, k: int, batch: list[list[int]], max_tokens: list[int]
) -> list[tuple[list[int], list[int]]]:
    """(output tokens, accepted drafts per round) per prompt, from z-lab's dflash_generate."""
    target, draft = load_reference(target_folder, draft_folder)
    out = []
    for prompt, n in zip(batch, max_tokens, strict=True):
        result = zlab.dflash_generate(
            draft,
            target,
            torch.tensor([prompt]),
            n,
            None,
            temperature=0.0,
            block_size=k + 1,
            return_stats=True,
        )
        out.append((result.output_ids[0, len(prompt) :].tolist(), reference_rounds(result, n)))
    return out


def run_openinfer(
    target_folder: Path, draft_folder: Path, k: int, batch: list[list[int]], max_tokens: list[int], log: Path
) -> list[tuple[list[int], list[int]]]:
    """The same, from one engine core serving every prompt at once (batched drafts, paged context)."""
    config = EngineConfig(
        model_path=target_folder,
        served_model_name="t",
        speculative=DrafterSpec("dflash", k, draft_folder),
        spec_log=log,
        max_num_batched_tokens=32,  # the 40-token prompt is prefilled in two chunks
    )
    core = EngineCore(config)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(batch))}
    for i, (prompt, n) in enumerate(zip(batch, max_tokens, strict=True)):
        core.add_request(
            EngineCoreRequest(str(i), prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        )
    while core.has_work:
        for output in core.step():
            tokens[output.request_id].extend(output.new_token_ids)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    out = []
    for i, n in enumerate(max_tokens):
        mine = [x for x in lines if x["request_id"] == str(i)]
        # Every draft is as long as K and the tokens left allow: the reference's block, less its extra slot.
        assert all(1 <= x["num_draft_tokens"] <= min(k, n - 2) for x in mine)
        out.append((tokens[str(i)], [x["num_accepted"] for x in mine]))
    return out


def assert_same_rounds(
    target_folder: Path, draft_folder: Path, k: int, tmp_path: Path, seed: int = 0
) -> list[int]:
    """Tokens and accepted counts per round equal z-lab's for every prompt; returns all accepted counts."""
    batch = prompts(seed)
    reference = run_reference(target_folder, draft_folder, k, batch, MAX_TOKENS)
    ours = run_openinfer(target_folder, draft_folder, k, batch, MAX_TOKENS, tmp_path / f"spec-{k}.jsonl")
    for i, ((ref_tokens, ref_rounds), (our_tokens, our_rounds)) in enumerate(
        zip(reference, ours, strict=True)
    ):
        assert our_tokens == ref_tokens, f"prompt {i}: tokens differ"
        assert our_rounds == ref_rounds, f"prompt {i}: accepted per round differ"
    return [a for _, rounds in ours for a in rounds]


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
    assert_same_rounds(target, draft, k, tmp_path)


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
    drafter.extend_context([ContextUpdate(block_ids, 0, torch.cat(aux, dim=-1))])
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
    assert_same_rounds(target, draft, 15, tmp_path, seed=2)
