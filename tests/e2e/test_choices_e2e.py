"""``n`` choices on a real engine serving the built-in pair with its DFlash drafter: the choices share the
prompt's prefix-cache blocks (the drafter's context included), and each choice drafts, is logged and is
reported on its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from openinfer.benchmarks.prefix_cache_check import HITS, QUERIES, counters
from openinfer.engine_core.builtin_model import (
    BUILTIN_NUM_SPEC_TOKENS,
    builtin_drafter_folder,
    builtin_target_folder,
)
from tests.e2e.processes import Cluster

BLOCK_SIZE = 16  # the engine's KV block, in tokens
PROMPT = (
    "KING RICHARD III:\nNow is the winter of our discontent\nMade glorious summer by this sun of York;\n"
    "And all the clouds that lour'd upon our house\nIn the deep bosom of the ocean buried."
)


@pytest.fixture(scope="module")
def dflash_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A frontend and one CPU engine serving the built-in target with its DFlash drafter, writing a spec log
    and sleeping 0.1 s after each step it runs: requests sent while it sleeps are read together, as requests
    sent within one step of a loaded engine are."""
    c = Cluster(tmp_path_factory.mktemp("choices"))
    try:
        c.start_frontend()
        c.start_engine(
            builtin_target_folder(),
            0,
            "--spec-method",
            "dflash",
            "--num-spec-tokens",
            str(BUILTIN_NUM_SPEC_TOKENS),
            "--draft-model",
            str(builtin_drafter_folder()),
            "--spec-log",
            str(c.log_dir / "spec0.jsonl"),
            "--step-sleep",
            "0.1",
        )
        c.wait_healthy()
        yield c
    finally:
        c.stop()


async def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json={"model": "tiny", **body}) as response:
            assert response.status == 200, await response.text()
            return await response.json()


async def test_choices_share_the_prompts_prefix_cache_blocks(dflash_cluster: Cluster) -> None:
    """n=4 on a prompt of several blocks, sent while another request keeps the engine busy: the prompt is
    computed once, and each of the 3 other choices finds every full block before its last token cached,
    drafter context included (children admitted in choice 0's own step would find none: the drafter's
    context of a block is written after the step that computes it), as the engine's counters show."""
    url = dflash_cluster.url
    busy = {"model": "tiny", "prompt": "JULIET:", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json=busy) as background:
            await background.content.readuntil(b"\n\n")  # it runs: each step is followed by a sleep
            before = counters(url)
            body = {"prompt": PROMPT, "max_tokens": 8, "n": 4, "seed": 1, "ignore_eos": True}
            answer = await complete(url, body)
            after = counters(url)  # the last output's message carried the counters of every lookup
            background.close()
    num_prompt = answer["usage"]["prompt_tokens"]
    assert num_prompt > 3 * BLOCK_SIZE
    cached_per_choice = (num_prompt - 1) // BLOCK_SIZE * BLOCK_SIZE  # full blocks before the last token
    assert after[QUERIES] - before[QUERIES] == 4 * num_prompt
    assert after[HITS] - before[HITS] == 3 * cached_per_choice
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # as choice 0, sent first, found it


async def test_each_choice_drafts_and_is_counted_on_its_own(dflash_cluster: Cluster) -> None:
    """n=3 sampled: the spec log has rounds of each child ("i_ID"), and each choice's "metrics" are exactly
    its own child's rounds, drafted and accepted tokens."""
    body = {"prompt": "ROMEO:", "max_tokens": 24, "n": 3, "temperature": 0.8, "seed": 5, "ignore_eos": True}
    answer = await complete(dflash_cluster.url, body)
    lines = [json.loads(line) for line in (dflash_cluster.log_dir / "spec0.jsonl").read_text().splitlines()]
    for choice in answer["choices"]:
        rounds = [line for line in lines if line["request_id"] == f"{choice['index']}_{answer['id']}"]
        assert rounds, choice["index"]
        spec = choice["metrics"]["speculative_decoding"]
        assert spec["num_spec_steps"] == len(rounds)
        assert spec["num_draft_tokens"] == sum(line["num_draft_tokens"] for line in rounds)
        assert spec["num_accepted_draft_tokens"] == sum(line["num_accepted"] for line in rounds)
    assert "metrics" not in answer
