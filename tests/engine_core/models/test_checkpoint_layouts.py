"""Hugging Face checkpoint layouts of real Qwen3 folders: sharded safetensors with an index, tied and
untied heads, weights saved in bf16, and generation_config.json's list of EOS ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.process.engine_cli import load_runner
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3 as SMALL
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner
from openinfer.protocol import EngineCoreRequest, FinishReason, SamplingParams

PROMPT = [5, 17, 300, 9, 44, 120, 7, 7, 7, 260, 3]


def logits(folder: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Our logits (len(PROMPT), vocab) for PROMPT, one prefill of a fresh runner."""
    runner = ModelRunner(folder, torch.device("cpu"), num_kv_blocks=1, block_size=16, dtype=dtype)
    return runner.execute(chunk_step([SeqChunk(PROMPT, 0, [0], num_logits=len(PROMPT))], runner)).logits


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_sharded_checkpoint_serves_like_one_file(tmp_path: Path, tied: bool) -> None:
    """The same weights in one file, in 2 and in 3 shards with model.safetensors.index.json give bit-equal
    logits, and transformers' on the sharded folder; an untied head is read from its shard, a tied one
    never stored."""
    one, two, three = (
        make_tiny_checkpoint(
            tmp_path / str(n), seed=4, tie_word_embeddings=tied, overrides=SMALL, num_shards=n
        )
        for n in (1, 2, 3)
    )
    assert not (one / "model.safetensors.index.json").exists()
    index = json.loads((three / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)
    ]
    assert ("lm_head.weight" in index["weight_map"]) == (not tied)
    assert not (three / "model.safetensors").exists()
    expected = logits(one)
    assert torch.equal(logits(two), expected) and torch.equal(logits(three), expected)
    hf = Qwen3ForCausalLM.from_pretrained(two, dtype=torch.float32).eval()
    with torch.inference_mode():
        torch.testing.assert_close(hf(torch.tensor([PROMPT])).logits[0], expected, rtol=0, atol=1e-4)


def test_bf16_checkpoint_runs_in_float32_and_bfloat16(tmp_path: Path) -> None:
    """Weights saved in bf16 (Qwen3's own files) load exactly into float32 (dtype auto on the CPU: the
    logits are transformers' float32 logits of the same file) and run in bfloat16 too."""
    folder = make_tiny_checkpoint(
        tmp_path / "bf16", seed=4, overrides=SMALL, dtype=torch.bfloat16, num_shards=2
    )
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    ours = logits(folder)
    hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        torch.testing.assert_close(hf(torch.tensor([PROMPT])).logits[0], ours, rtol=0, atol=1e-4)
    in_bf16 = logits(folder, torch.bfloat16)
    assert in_bf16.dtype == torch.float32 and in_bf16.isfinite().all()
    # bf16 keeps 8 significant bits: the logits (|x| < 30 here) agree to a few bf16 steps.
    assert (in_bf16 - ours).abs().max() < 0.05 * ours.abs().max()


def run(folder: Path, max_tokens: int, ignore_eos: bool) -> tuple[list[int], FinishReason | None]:
    config = EngineConfig(model_path=folder, served_model_name="t")
    core = EngineCore(config, load_runner(config))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
    core.add_request(EngineCoreRequest("r", PROMPT, params))
    tokens, finish = [], None
    while core.has_work:
        for output in core.step():
            tokens += output.new_token_ids
            finish = output.finish or finish
    return tokens, finish


@pytest.mark.parametrize("position", [0, 1])
def test_engine_stops_on_every_generation_config_eos(tmp_path: Path, position: int) -> None:
    """generation_config.json's EOS list (Qwen3: [151645, 151643]) adds to config.json's: a greedy run
    stops, finish "stop", on whichever of the list's ids it samples first."""
    folder = make_tiny_checkpoint(tmp_path / "ckpt", seed=4, overrides=SMALL)
    free_run, _ = run(folder, max_tokens=16, ignore_eos=True)
    # The first token at index >= 2 not seen before it becomes an EOS; another id, never sampled, too.
    stop_at = next(i for i in range(2, 16) if free_run[i] not in free_run[:i])
    unused = next(t for t in range(1, 512) if t not in free_run)
    assert 0 not in free_run[: stop_at + 1]  # config.json's EOS, 0, is not what stops it
    eos = [unused, free_run[stop_at]] if position else [free_run[stop_at], unused]
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": eos}))
    tokens, finish = run(folder, max_tokens=16, ignore_eos=False)
    assert tokens == free_run[: stop_at + 1]
    assert finish == FinishReason("stop", stop_token_id=free_run[stop_at])
