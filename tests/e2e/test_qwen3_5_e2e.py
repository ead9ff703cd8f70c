"""``openinfer-serve`` on a Qwen3.5 folder in the released vision-language layout (vision tower and MTP head
on disk, not served): greedy completions with an n-gram drafter, then a DFlash drafter loaded at run time,
are transformers' greedy tokens, /metrics equals the engine's spec log bin by bin, a drafter of more tokens
than the state groups keep is refused, and image or video chat parts are refused as text-only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from openinfer.engine_core.testing.qwen3_5_checkpoint import (
    load_hf_text_model,
    make_repetitive_qwen3_5_checkpoint,
    repetitive_prompts,
)
from openinfer.tools.spec_tally import SpecLogTally, tally_metrics
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster
from tests.e2e.settled_metrics import metrics_matching_logs

K = 7  # the start drafter's K: the state groups keep K + 1 states per request
MAX_TOKENS = 24


class Served:
    """The serve under test, the target folder and its DFlash drafter's (a sibling: an allowed folder)."""

    def __init__(self, cluster: Cluster, target: Path, drafter: Path) -> None:
        self.cluster, self.target, self.drafter = cluster, target, drafter
        self.spec_logs = [cluster.log_dir / "spec-engine0.jsonl"]  # type: ignore[operator]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One ``openinfer-serve`` (a frontend and a CPU engine) on the repeating 64-token Qwen3.5 target in the
    released layout, with prompt lookup K = 7 and a spec log."""
    folder = tmp_path_factory.mktemp("qwen3_5")
    target = make_repetitive_qwen3_5_checkpoint(folder / "target", layout="conditional")
    # the DFlash drafter reads a DeltaNet layer (1) and the full-attention one (3); its K is block_size - 1
    drafter = make_tiny_dflash_checkpoint(
        folder / "dflash", target, seed=1, block_size=K + 1, target_layer_ids=(1, 3)
    )
    cluster = Cluster(tmp_path_factory.mktemp("qwen3_5-serve"))
    try:
        cluster.start_serve(target, "--spec-method", "ngram", "--num-spec-tokens", str(K),
                            "--spec-log-dir", str(cluster.log_dir), "--admin-api-key", ADMIN_KEY)  # fmt: skip
        cluster.wait_healthy(timeout=120)
        yield Served(cluster, target, drafter)
    finally:
        cluster.stop()


async def greedy(url: str) -> list[list[int]]:
    """Every prompt at once as token ids (all below the 64-token vocabulary), greedy; their output ids."""
    body = {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip

    async def one(session: aiohttp.ClientSession, prompt: list[int]) -> list[int]:
        async with session.post(f"{url}/v1/completions", json={**body, "prompt": prompt}) as r:
            answer = await r.json()
            assert r.status == 200, answer
        assert answer["choices"][0]["prompt_token_ids"] == prompt
        return list(answer["choices"][0]["token_ids"])

    async with aiohttp.ClientSession() as session:
        return await asyncio.gather(*(one(session, p) for p in repetitive_prompts()))


async def settled_logs(served: Served) -> tuple[str, SpecLogTally]:
    async with aiohttp.ClientSession() as session:
        return await metrics_matching_logs(session, served.cluster.url, served.spec_logs, K)


@pytest.fixture(scope="module")
def ngram_outputs(served: Served) -> list[list[int]]:
    """The prompts' greedy tokens served with prompt lookup: transformers' greedy, teacher-forced."""
    outputs = asyncio.run(greedy(served.cluster.url))
    assert all(len(output) == MAX_TOKENS for output in outputs)
    assert_hf_greedy(served.target, repetitive_prompts(), outputs, load_hf_text_model)
    return outputs


async def test_ngram_metrics_equal_the_spec_log(served: Served, ngram_outputs: list[list[int]]) -> None:
    """Prompt lookup on the repeating target: drafts accepted at several lengths and rejected too, and
    /metrics' spec-decode counters are the engine's spec log, bin by bin."""
    text, logs = await settled_logs(served)
    assert not logs.malformed
    assert tally_metrics(text)[0].bins(K, K + 1) == logs.engines[0].bins(K, K + 1)
    hist = logs.engines[0].hist
    assert hist[0] > 0 and sum(count > 0 for count in hist[1:]) >= 3, hist  # rejections, several lengths


async def test_a_dflash_drafter_loaded_at_run_time_is_lossless(
    served: Served, ngram_outputs: list[list[int]]
) -> None:
    """The admin API swaps prompt lookup for a DFlash drafter of the same K (state groups were sized for
    K = 7): the same tokens, and /metrics still equals the spec log; K = 8 would need more states per
    request than the groups keep, and is refused with a 400 saying so."""
    _, before = await settled_logs(served)
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as s:
        url = f"{served.cluster.url}/admin/engines/0/drafter"
        body = {"method": "ngram", "num_spec_tokens": K + 1}
        async with s.post(url, json=body) as r:
            too_many = r.status, (await r.json())
        body = {"method": "dflash", "num_spec_tokens": K, "draft_model": str(served.drafter)}
        async with s.post(url, json=body) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["num_spec_tokens"] == K
    assert too_many[0] == 400, too_many
    assert "keeps 8 state slot(s) per request" in too_many[1]["error"]["message"], too_many  # 1 + K
    assert await greedy(served.cluster.url) == ngram_outputs
    text, after = await settled_logs(served)
    assert tally_metrics(text)[0].bins(K, K + 1) == after.engines[0].bins(K, K + 1)
    assert after.engines[0].num_drafts > before.engines[0].num_drafts  # DFlash drafted


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
PARTS: list[tuple[dict[str, Any], str]] = [
    (IMAGE, "an image"),
    ({"type": "input_image", "image_url": "https://example.com/cat.png"}, "an image"),
    ({"type": "video_url", "video_url": {"url": "https://example.com/cat.mp4"}}, "a video"),
]


@pytest.mark.parametrize(("part", "kind"), PARTS)
async def test_image_and_video_parts_are_refused_as_text_only(
    served: Served, part: dict[str, Any], kind: str
) -> None:
    """A chat message with an image or video part, next to text, is an OpenAI-style 400 saying the server
    serves text only: the released folder's vision tower is not served."""
    content = [{"type": "text", "text": "What is in this picture?"}, part]
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{served.cluster.url}/v1/chat/completions", json=body) as r:
            status, answer = r.status, await r.json()
    assert status == 400, answer
    error = answer["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "messages")
    assert f"`messages[0].content[1]` is {kind} part ({part['type']!r})" in error["message"], error
    assert "serves text only" in error["message"], error
