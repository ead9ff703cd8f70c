"""The built-in model (a trained tiny Qwen3, its DFlash drafter in z-lab's layout and its DSpark and DFlash
drafters in DeepSpec's, shipped as package data): the documented architecture, a fast load, and lossless
speculation at temperature 0 with real acceptance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from openinfer.engine_core.builtin_model import (
    BUILTIN_NUM_SPEC_TOKENS,
    builtin_drafter_folder,
    builtin_target_folder,
    builtin_tokenizer_folder,
)
from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash_config import AnchorLayout, DFlashConfig
from openinfer.engine_core.models.drafter_fit import check_fits_target
from openinfer.engine_core.models.dspark_heads import MarkovHeadType
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.drafter_loaders import folder_drafter
from openinfer.engine_core.testing.engine_cores import CheckedSteps, generate_greedy, make_core
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.spec_logs import read_spec_log, spec_log_counters
from openinfer.engine_core.testing.tiny_model import TINY_QWEN3_CONFIG
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.protocol import EngineCoreRequest, SamplingParams, SpecDecodeCounters

K = BUILTIN_NUM_SPEC_TOKENS
MAX_TOKENS = 48
# Shakespeare-like prompts, as the bench's tinyshakespeare workload sends (the model was trained on it).
PROMPTS = [
    "ROMEO:",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n",
    "KING RICHARD III:\nNow is the winter of our discontent\nMade glorious summer by this sun of York;",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;",
    "DUKE VINCENTIO:\nMy lord, I will",
    "Second Servingman:\nWhat, what, what? Ha!",
]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(builtin_target_folder() / "tokenizer.json"))
    return [tokenizer.encode(text).ids for text in PROMPTS]


@pytest.fixture(scope="module")
def baseline(prompts: list[list[int]]) -> list[list[int]]:
    return generate_greedy(make_core(builtin_target_folder(), "builtin"), prompts, MAX_TOKENS)


def test_architecture_and_files() -> None:
    """The target has TINY_QWEN3_CONFIG's architecture and the built-in tokenizer; the drafter fits it, with
    an 8-slot block in the anchor-slot layout (its config says so; K = 7 is what it was trained for) and a
    mask token that is not a special token; each folder has its model card."""
    target = ModelConfig.from_folder(builtin_target_folder())
    sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    assert [getattr(target, name) for name in sizes] == [TINY_QWEN3_CONFIG[name] for name in sizes]
    assert target.eos_token_ids == (0,) and target.tie_word_embeddings
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (builtin_target_folder() / name).read_bytes() == (
            builtin_tokenizer_folder() / name
        ).read_bytes()
    drafter = DFlashConfig.from_folder(builtin_drafter_folder())
    check_fits_target(drafter, target)
    assert (drafter.block_size, drafter.anchor) == (8, AnchorLayout.ANCHOR_SLOT) and drafter.max_drafts >= K
    assert drafter.mask_token_id > 2  # not a special token: the chat template's tokens stay themselves
    assert (builtin_target_folder() / "README.md").is_file() and (
        builtin_drafter_folder() / "README.md"
    ).is_file()


@pytest.mark.parametrize("name", ["dspark_block7", "dflash_block7"])
def test_deepspec_drafters(name: str) -> None:
    """The DeepSpec-layout drafters fit the target: 7-slot blocks, every slot drafting (K = 7); the DSpark one
    with a vanilla Markov head and a confidence head reading it, the DFlash one with neither; each folder with
    its model card, within 12 MB, served by the method `--draft-model` alone picks."""
    folder = builtin_target_folder().parent / name
    config = DFlashConfig.from_folder(folder)
    check_fits_target(config, ModelConfig.from_folder(builtin_target_folder()))
    assert config.heads is not None and (config.block_size, config.max_drafts) == (7, K)
    if name == "dspark_block7":
        assert folder == builtin_drafter_folder("dspark")
        assert config.heads.markov_rank > 0 and config.heads.markov_head_type is MarkovHeadType.VANILLA
        assert config.heads.confidence_head and config.heads.confidence_with_markov
    else:
        assert config.heads.markov_rank == 0 and not config.heads.confidence_head
    assert folder_drafter(folder) == (name.removesuffix("_block7"), K)
    assert (folder / "README.md").is_file() and (folder / "model.safetensors").stat().st_size <= 12 * 10**6


def test_weights_are_small_and_load() -> None:
    """Both safetensors files together stay within 25 MB, and the engine loads the pair (how fast is a
    benchmark's business)."""
    files = [folder / "model.safetensors" for folder in (builtin_target_folder(), builtin_drafter_folder())]
    assert sum(f.stat().st_size for f in files) <= 25 * 10**6
    runner = ModelRunner(builtin_target_folder(), torch.device("cpu"), num_kv_blocks=64)
    assert DFlashDrafter(builtin_drafter_folder(), runner, K).num_spec_tokens == K


def assert_log_is_the_counters(core: EngineCore, log: Path) -> SpecDecodeCounters:
    assert core.spec is not None
    from_log = spec_log_counters(read_spec_log(log), K)  # every field, DSpark's confidence sums too
    assert core.spec.counters == from_log
    assert from_log.violation() is None
    return from_log


def test_dflash_is_lossless_with_real_acceptance(
    prompts: list[list[int]], baseline: list[list[int]], tmp_path: Path
) -> None:
    """The built-in DFlash drafter (K=7) changes no token of a run without speculation, which is HF's
    greedy output; and, being trained, it gets drafts accepted: at least 2 draft tokens per round on these
    prompts (the issue's bar; ~3 is measured, see the drafter's model card)."""
    log = tmp_path / "spec.jsonl"
    core = make_core(
        builtin_target_folder(),
        "builtin",
        speculative=DrafterSpec("dflash", K, builtin_drafter_folder()),
        spec_log=log,
    )
    outputs = generate_greedy(core, prompts, MAX_TOKENS)
    assert outputs == baseline
    assert_hf_greedy(builtin_target_folder(), prompts, outputs)
    counters = assert_log_is_the_counters(core, log)
    assert counters.num_accepted_tokens >= 2.0 * counters.num_drafts


@pytest.mark.parametrize("name", ["dspark_block7", "dflash_block7"])
def test_deepspec_drafters_are_lossless_with_real_acceptance(
    name: str, prompts: list[list[int]], baseline: list[list[int]], tmp_path: Path
) -> None:
    """The DeepSpec-layout drafters (K = 7, every verified) change no token, and get at least 2 draft tokens
    accepted per round on these prompts (their model cards have the held-out figures)."""
    log = tmp_path / "spec.jsonl"
    folder = builtin_target_folder().parent / name
    method, k = folder_drafter(folder)
    core = make_core(
        builtin_target_folder(), "builtin", speculative=DrafterSpec(method, k, folder), spec_log=log
    )
    assert generate_greedy(core, prompts, MAX_TOKENS) == baseline
    counters = assert_log_is_the_counters(core, log)
    assert counters.num_accepted_tokens >= 2.0 * counters.num_drafts


def test_dspark_samples_its_drafts_at_temperature(tmp_path: Path) -> None:
    """At temperature 1 the built-in DSpark drafter draws its drafts from q and the target verifies them
    against q: every pending round carries a distribution per draft that gave it its draft, and the rounds
    accept 0.78 drafts each on these seeded requests (verified against a one-hot q, drafts like these
    accept 0.07, greedy drafts 0.13: `docs/benchmarks.md`); the counters equal the spec log, snapshot by snapshot
    within docs/design.md's invariants. (That the output keeps the target's distribution is the verification
    kernel's test.)"""
    log = tmp_path / "spec.jsonl"
    folder = builtin_drafter_folder("dspark")
    core = make_core(
        builtin_target_folder(), "builtin", speculative=DrafterSpec("dspark", K, folder), spec_log=log
    )
    prompt = Tokenizer.from_file(str(builtin_target_folder() / "tokenizer.json")).encode("ROMEO:\n").ids
    for i in range(200):
        params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True, seed=i)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    steps, pending = CheckedSteps(core), 0
    while core.has_work:
        for request in core.scheduler.running:
            if request.spec_token_ids:
                q = request.spec_probs
                assert q is not None and q.shape[0] >= len(request.spec_token_ids)
                drafts = torch.tensor(request.spec_token_ids)
                assert bool((q[torch.arange(len(drafts)), drafts] > 0).all())
                torch.testing.assert_close(q.sum(-1), torch.ones(q.shape[0]))
                pending += 1
        steps.step()
    counters = assert_log_is_the_counters(core, log)
    assert pending > 100 and counters.num_accepted_tokens >= 0.5 * counters.num_drafts


def test_ngram_is_lossless(prompts: list[list[int]], baseline: list[list[int]], tmp_path: Path) -> None:
    """n-gram lookup (K=7) on the built-in target changes no token either."""
    log = tmp_path / "spec.jsonl"
    core = make_core(builtin_target_folder(), "builtin", speculative=DrafterSpec("ngram", K), spec_log=log)
    assert generate_greedy(core, prompts, MAX_TOKENS) == baseline
    assert assert_log_is_the_counters(core, log).num_drafts > 0
