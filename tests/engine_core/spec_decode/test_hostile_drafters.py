"""Hostile DFlash/DSpark folders (issue 39, item 3) are refused at load, before anything is allocated, with a
ValueError naming the value and its bound: config numbers that are not integers or are past what the target
allows, floats past their ranges, fields of another JSON type, NaN or infinite weights, weights the config
does not describe, files that are not safetensors, a drafter past the memory budget; at start, before the
KV cache is sized from it. A refused load leaves the engine drafting with the drafter it had."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.core.kv_sizing import kv_block_bytes
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.models.dspark_heads import SAMPLED_CONFIDENCE_FILE
from openinfer.engine_core.spec_decode import drafter_budget
from openinfer.engine_core.spec_decode.dflash import DFlashDrafter
from openinfer.engine_core.spec_decode.drafter_budget import SMALL_DRAFTER_BYTES, DrafterMemory
from openinfer.engine_core.spec_decode.drafter_loaders import folder_drafter
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner

K = 7  # the DSpark checkpoint's block_size: it drafts all 7
WIDTH = 64 + 16  # what its confidence head reads: the hidden size and the Markov rank
GIB = 2**30


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 layers of hidden size 64 over the built-in tokenizer's 512 tokens."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target"), seed=5, overrides=SMALL_TEXT_QWEN3)


@pytest.fixture(scope="module")
def good(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_dspark_checkpoint(tmp_path_factory.mktemp("good") / "d", target, seed=1, block_size=K)


@pytest.fixture(scope="module")
def runner(target: Path) -> ModelRunner:
    return ModelRunner(target, torch.device("cpu"), num_kv_blocks=16, block_size=16)


def hostile_copy(good: Path, folder: Path, **config: Any) -> Path:
    """A copy of ``good`` whose config.json has ``config``'s keys set."""
    shutil.copytree(good, folder)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


def with_weights(good: Path, folder: Path, **tensors: torch.Tensor) -> Path:
    """A copy of ``good`` whose safetensors have ``tensors`` set (by name, "." spelt "__")."""
    shutil.copytree(good, folder)
    weights = load_file(folder / "model.safetensors")
    weights.update({name.replace("__", "."): tensor for name, tensor in tensors.items()})
    save_file(weights, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"block_size": 1e9}, r"block_size must be an integer, got 1000000000\.0 \(float\)"),  # JSON 1e9
        ({"block_size": 10**9}, r"block_size must be in \[1, 33\], got 1000000000"),
        ({"num_hidden_layers": 1e6}, r"num_hidden_layers must be an integer"),
        ({"num_hidden_layers": 10**6}, r"num_hidden_layers must be in \[1, 1024\], got 1000000"),
        ({"num_hidden_layers": 3}, r"num_hidden_layers 3 is more draft layers than the 2 layers"),
        ({"num_hidden_layers": 3, "num_target_layers": None}, r"no deeper than its target \(2 layers\)"),
        (
            {"intermediate_size": 100_000},
            r"intermediate_size is 100000, more than 8 x the hidden size \(512\)",
        ),
        ({"num_attention_heads": 4096}, r"num_attention_heads x head_dim is 65536, more than 8 x"),
        ({"head_dim": 1024, "num_attention_heads": 2}, r"head_dim 1024 is wider than 256"),
        ({"vocab_size": 100_000}, r"vocab_size 100000 must equal the target's 512"),
        ({"markov_rank": 1e9}, r"markov_rank must be an integer"),
        ({"markov_rank": 1000}, r"markov_rank 1000 is more than the vocabulary \(512\)"),
        ({"mask_token_id": "5"}, r"mask_token_id must be an integer, got '5'"),
        ({"target_layer_ids": [True]}, r"target_layer_ids\[\] must be an integer, got True"),
        ({"target_layer_ids": [0] * 5}, r"target_layer_ids name 5 layers; the target has 2"),
        ({"rope_theta": float("nan")}, r"rope_theta must be a finite number, got nan"),
        ({"rms_norm_eps": float("inf")}, r"rms_norm_eps must be a finite number, got inf"),
        ({"output_multiplier": float("inf")}, r"output_multiplier must be a finite number"),
        ({"model_type": "qwen3_5"}, r"model_type must be 'qwen3'"),
        # finite, but far past any checkpoint's: the draft would overflow at run time
        ({"input_embedding_scale": 1e30}, r"input_embedding_scale must be in \[0\.001, 1000\], got 1e\+30"),
        ({"output_multiplier": 1e-30}, r"output_multiplier must be in \[0\.001, 1000\]"),
        ({"final_logit_softcapping": 1e-30}, r"final_logit_softcapping must be in \[0\.001, 1000\]"),
        ({"rope_theta": 1e-300}, r"rope_theta must be in \[1, 1e\+12\], got 1e-300"),
        ({"rms_norm_eps": 1e-300}, r"rms_norm_eps must be in \[1e-12, 1\]"),
        # JSON types the readers do not take: refused by name, never an AttributeError or a TypeError
        ({"rope_scaling": ["yarn"]}, r"rope_scaling must be an object, got \['yarn'\] \(list\)"),
        ({"rope_parameters": "default"}, r"rope_parameters must be an object, got 'default' \(str\)"),
        ({"dflash_config": [1]}, r"dflash_config must be an object"),
        ({"architectures": 5}, r"architectures must be an array, got 5 \(int\)"),
        ({"layer_types": [{}]}, r"every item of layer_types must be a string"),
        ({"markov_head_type": ["gated"]}, r"markov_head_type must be a string"),
        ({"eos_token_id": {"id": 1}}, r"eos_token_id must be an integer or an array"),
        ({"enable_confidence_head": "false"}, r"enable_confidence_head must be true or false, got 'false'"),
        (
            {"sampled_confidence_temperature": "0.8"},
            r"sampled_confidence_temperature must be a finite number",
        ),
        (
            {"sampled_confidence_temperature": -1},
            r"sampled_confidence_temperature must be in \[0\.001, 1000\], got -1",
        ),
        ({"sampled_confidence_temperature": 0.8}, r"sampled_confidence\.safetensors is not there"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
)
def test_hostile_configs_are_refused_before_allocating(
    good: Path, runner: ModelRunner, tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    """Each value is refused from config.json and the target alone, naming the value and its bound."""
    folder = hostile_copy(good, tmp_path / "d", **config)
    with pytest.raises(ValueError, match=message):
        DFlashDrafter(folder, runner, K)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"fc__weight": torch.full((64, 64), float("nan"))}, r"'fc\.weight' holds NaN or infinite values"),
        ({"norm__weight": torch.full((64,), float("inf"))}, r"'norm\.weight' holds NaN or infinite values"),
        # finite in the file, infinite as the engine's float32
        ({"norm__weight": torch.full((64,), 1e300, dtype=torch.float64)}, r"'norm\.weight' holds NaN"),
        ({"norm__weight": torch.ones(64, dtype=torch.int64)}, r"'norm\.weight' is I64"),
        # DeepSpec's copy of the target's embedding is never loaded, but its shape is the config's
        ({"embed_tokens__weight": torch.zeros(10, 10)}, r"'embed_tokens\.weight' has shape \(10, 10\)"),
    ],
    ids=["nan", "inf", "overflows-float32", "integer", "misshapen-copy"],
)
def test_bad_weights_are_refused(
    good: Path, runner: ModelRunner, tmp_path: Path, tensors: dict[str, torch.Tensor], message: str
) -> None:
    folder = with_weights(good, tmp_path / "d", **tensors)
    with pytest.raises(ValueError, match=message):
        DFlashDrafter(folder, runner, K)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            {"proj.weight": torch.zeros(1, 5), "proj.bias": torch.zeros(1)},
            r"'sampled_confidence_head\.proj\.weight' has shape \(1, 5\)",
        ),
        ({"proj.weight": torch.full((1, WIDTH), float("nan")), "proj.bias": torch.zeros(1)}, r"holds NaN"),
        ({"proj.bias": torch.zeros(1)}, r"1 tensors missing .*sampled_confidence_head\.proj\.weight"),
        (
            {"proj.weight": torch.zeros(1, WIDTH), "proj.bias": torch.zeros(1), "other": torch.zeros(1)},
            r"unexpected tensor 'sampled_confidence_head\.other'; sampled_confidence\.safetensors holds",
        ),
    ],
    ids=["misshapen", "nan", "missing", "unexpected"],
)
def test_a_sampled_head_file_is_checked_as_the_checkpoint_is(
    good: Path, runner: ModelRunner, tmp_path: Path, tensors: dict[str, torch.Tensor], message: str
) -> None:
    """The sampled confidence head's own file (sampled_confidence.safetensors) is refused, naming the
    tensor, when it holds a tensor of another shape, a NaN, too few tensors or one of no head's; a good one
    loads."""
    head = {f"sampled_confidence_head.{name}": tensor for name, tensor in tensors.items()}
    folder = hostile_copy(good, tmp_path / "d", sampled_confidence_temperature=0.8)
    save_file(head, str(folder / SAMPLED_CONFIDENCE_FILE))
    with pytest.raises(ValueError, match=message):
        DFlashDrafter(folder, runner, K)
    save_file(
        {
            f"sampled_confidence_head.proj.{n}": torch.zeros(s)
            for n, s in [("weight", (1, WIDTH)), ("bias", (1,))]
        },
        str(folder / SAMPLED_CONFIDENCE_FILE),
    )
    assert DFlashDrafter(folder, runner, K).model.sampled_confidence_head is not None


@pytest.mark.parametrize("damage", ["truncated", "huge-header"])
def test_a_file_that_is_not_safetensors_is_refused_naming_it(
    good: Path, runner: ModelRunner, tmp_path: Path, damage: str
) -> None:
    """The headers are read as the target's loader reads them: safetensors' own errors are ValueErrors naming
    the file (the engine exits 2 at start), never a SafetensorError."""
    folder = Path(shutil.copytree(good, tmp_path / "d"))
    file = folder / "model.safetensors"
    data = file.read_bytes()
    # half the file; or a header length of 2^40 bytes, past the file's end
    file.write_bytes(
        data[: len(data) // 2] if damage == "truncated" else (1 << 40).to_bytes(8, "little") + data[8:]
    )
    with pytest.raises(ValueError, match=rf"{file} is not a valid safetensors file"):
        DFlashDrafter(folder, runner, K)


def test_the_kv_cache_is_sized_from_a_start_drafter_only_once_it_fits(
    good: Path, target: Path, tmp_path: Path
) -> None:
    """At start, a drafter deeper than its target is refused before its pages are counted in a KV block."""
    fits = EngineConfig(model_path=target, served_model_name="t", speculative=DrafterSpec("dspark", K, good))
    model = ModelConfig.from_folder(target)
    # (the target's 2 layers + the drafter's 1) x (keys, values) x 2 heads x 16 dims x 16 tokens x 4 bytes
    assert kv_block_bytes(fits, model, torch.float32) == (2 + 1) * 2 * 2 * 16 * 16 * 4
    deep = hostile_copy(good, tmp_path / "deep", num_hidden_layers=64, num_target_layers=None)
    config = replace(fits, speculative=DrafterSpec("dspark", K, deep))
    with pytest.raises(ValueError, match=r"num_hidden_layers 64: a drafter is no deeper than its target"):
        kv_block_bytes(config, model, torch.float32)


def test_weights_the_config_does_not_describe_are_refused_from_the_headers(
    good: Path, runner: ModelRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config whose MLP is narrower than its weights is refused by the headers, before the model is
    allocated (allocating it here fails the test)."""
    folder = hostile_copy(good, tmp_path / "d", intermediate_size=96)  # the weights are 128 wide

    def no_allocation(*args: object, **kwargs: object) -> None:
        raise AssertionError("the drafter was allocated")

    monkeypatch.setattr(torch.nn.Module, "to_empty", no_allocation)
    with pytest.raises(
        ValueError,
        match=r"'layers\.0\.mlp\.down_proj\.weight' has shape \(64, 128\), the config says \(64, 96\)",
    ):
        DFlashDrafter(folder, runner, K)


def test_a_drafter_past_the_memory_budget_is_refused(
    good: Path, runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heavier than its target (past the small-target floor), or more than the memory free: refused, saying
    what it needs; the budget's free memory is what the device has."""
    limit = DrafterMemory(parameters=SMALL_DRAFTER_BYTES + 1, context_cache=0, rope_table=0)
    with pytest.raises(ValueError, match="more than its target's 0.000 GiB .or 0.25 GiB beside a small"):
        limit.check(target_weights=1000, free=None)
    DrafterMemory(parameters=2 * GIB, context_cache=GIB, rope_table=0).check(4 * GIB, free=3 * GIB)
    with pytest.raises(ValueError, match=r"needs 3\.000 GiB .* only 2\.000 GiB are free"):
        DrafterMemory(parameters=2 * GIB, context_cache=GIB, rope_table=0).check(4 * GIB, free=2 * GIB)
    free = drafter_budget.free_memory(torch.device("cpu"))
    assert free is not None and free > 0  # Linux: MemAvailable
    monkeypatch.setattr(drafter_budget, "free_memory", lambda device: 1000)
    with pytest.raises(ValueError, match=r"only 0\.000 GiB are free: start the engine with this drafter"):
        DFlashDrafter(good, runner, K)


def test_the_launcher_reads_only_an_integer_block_size(good: Path, tmp_path: Path) -> None:
    """openinfer-serve and openinfer-engine take K from the folder's block_size: 1e9 is refused there too, and
    so is a field of another JSON type (architectures 5 was a TypeError)."""
    assert folder_drafter(good) == ("dspark", K)
    with pytest.raises(ValueError, match=r"--draft-model .*: block_size must be an integer"):
        folder_drafter(hostile_copy(good, tmp_path / "d", block_size=1e9))
    with pytest.raises(ValueError, match=r"--draft-model .*: architectures must be an array, got 5"):
        folder_drafter(hostile_copy(good, tmp_path / "a", architectures=5))


def test_a_config_json_that_is_no_file_of_the_folder_is_refused(good: Path, tmp_path: Path) -> None:
    """A drafter's config.json is read as the target's files are (``model_file``): a link out of the folder
    and a FIFO (whose open would block) are refused by name, at load and in the launcher."""
    outside = tmp_path / "outside.json"
    outside.write_bytes((good / "config.json").read_bytes())
    linked = Path(shutil.copytree(good, tmp_path / "linked"))
    (linked / "config.json").unlink()
    (linked / "config.json").symlink_to(outside)
    piped = Path(shutil.copytree(good, tmp_path / "piped"))
    (piped / "config.json").unlink()
    os.mkfifo(piped / "config.json")
    with pytest.raises(ValueError, match=r"config\.json leads to .*outside\.json, outside the model folder"):
        DFlashConfig.from_folder(linked)
    with pytest.raises(ValueError, match=r"--draft-model .*config\.json is a FIFO, not a regular file"):
        folder_drafter(piped)


def test_a_refused_load_keeps_the_drafter_it_had(good: Path, target: Path, tmp_path: Path) -> None:
    """After a refused load the engine still drafts with the DSpark drafter it had, K and counters kept."""
    core: EngineCore = make_core(target, num_kv_blocks=64)
    core.load_drafter(DrafterSpec("dspark", K, good))
    before = core.spec
    hostile = [
        hostile_copy(good, tmp_path / "block", block_size=1e9),
        with_weights(good, tmp_path / "nan", fc__weight=torch.full((64, 64), float("nan"))),
    ]
    for folder in hostile:
        with pytest.raises(ValueError):
            core.load_drafter(DrafterSpec("dspark", K, folder))
    assert core.spec is before
    generate_greedy(core, [[5, 9, 200, 31], list(range(40, 60))], max_tokens=12)
    counters = core.load_snapshot().spec_decode
    assert counters is not None and counters.num_spec_tokens == K and counters.num_drafts > 0
