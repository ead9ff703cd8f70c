"""--fake-model: the runner's deterministic logits, an engine core on it (with n-gram drafts that hit), and
the settings it refuses."""

from __future__ import annotations

import pytest
import torch

from openinfer.engine_core.builtin_model import builtin_tokenizer_folder
from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.process.engine_cli import config_from_args, load_runner, parse_args
from openinfer.engine_core.testing.seq_chunks import SeqChunk, chunk_step
from openinfer.engine_core.worker.fake_model_runner import (
    FAKE_CYCLE,
    FIRST_CYCLE_TOKEN,
    FakeModelRunner,
    successors,
)
from openinfer.protocol import EngineCoreRequest, SamplingParams


def test_successor_walks_the_cycle() -> None:
    """3 -> 4, the cycle's last token (34) -> 3, and anything outside it (specials, 35+) -> 3."""
    last = FIRST_CYCLE_TOKEN + FAKE_CYCLE - 1  # 34
    assert successors(torch.tensor([3, 4, last, 0, 2, 35, 511])).tolist() == [4, 5, 3, 3, 3, 3, 3]


def test_execute_gives_each_chunks_last_rows() -> None:
    """Rows for the last num_logits tokens of each chunk, in chunk order; argmax is the successor."""
    runner = FakeModelRunner(builtin_tokenizer_folder(), torch.device("cpu"), num_kv_blocks=8, block_size=4)
    chunks = [SeqChunk([3, 4, 5], 0, [0], num_logits=2), SeqChunk([9], 7, [1, 2], num_logits=1)]
    logits = runner.execute(chunk_step(chunks, runner)).logits
    assert logits.shape == (3, 512)  # 2 + 1 rows over the built-in vocabulary
    assert logits.argmax(dim=-1).tolist() == [5, 6, 10]
    with pytest.raises(ValueError, match="blocks"):
        runner.execute(
            chunk_step([SeqChunk([3] * 5, 0, [0], num_logits=1)], runner)
        )  # 5 tokens in one block of 4


def test_engine_core_on_the_fake_model_drafts_that_hit() -> None:
    """Greedy output is the cycle; with n-gram K=4 most drafts are fully accepted once a cycle is seen."""
    config = EngineConfig(
        model_path=builtin_tokenizer_folder(),
        served_model_name="fake",
        fake_model=True,
        num_kv_blocks=64,
        speculative=DrafterSpec("ngram", 4),
    )
    core = EngineCore(config, load_runner(config))
    params = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)
    core.add_request(EngineCoreRequest("r", [3, 4, 5], params))
    tokens: list[int] = []
    while core.has_work:
        for output in core.step():
            tokens.extend(output.new_token_ids)
    assert tokens == [FIRST_CYCLE_TOKEN + (6 - FIRST_CYCLE_TOKEN + i) % FAKE_CYCLE for i in range(80)]
    assert core.spec is not None
    counters = core.spec.counters
    assert counters.accepted_length_hist[4] > counters.num_drafts // 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fake-model", "--model", "/somewhere"], "drop --model"),
        (
            ["--fake-model", "--spec-method", "dflash", "--num-spec-tokens", "3", "--draft-model", "/d"],
            "ngram",
        ),
        (["--step-sleep", "-1"], "--step-sleep"),
    ],
)
def test_fake_model_settings_refused(args: list[str], message: str) -> None:
    """Contradictory settings are refused with a message naming the flag."""
    with pytest.raises(ValueError, match=message):
        config_from_args(parse_args(args))


def test_fake_model_defaults() -> None:
    """--fake-model needs no model folder: the built-in tokenizer and the name openinfer-fake."""
    config = config_from_args(parse_args(["--fake-model", "--step-sleep", "0.01"]))
    assert config.fake_model and config.step_sleep == 0.01
    assert config.served_model_name == "openinfer-fake"
    assert (config.model_path / "tokenizer.json").is_file()
