"""Frontend + 2 engines with n-gram speculation: /metrics equals the engines' spec logs, bin by bin."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from openinfer.engine_core.builtin_model import builtin_drafter_folder
from openinfer.tools.spec_tally import tally_metrics, total
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster
from tests.e2e.settled_metrics import metrics_matching_logs

K = 7


@pytest.fixture(scope="module")
def spec_cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Cluster]:
    """A frontend and two CPU engines with ngram K=7, each writing a spec log."""
    c = Cluster(tmp_path_factory.mktemp("spec"))
    try:
        c.start_frontend("--spec-log-interval", "1", "--admin-api-key", ADMIN_KEY)
        for index in (0, 1):
            c.start_engine(
                tiny_model,
                index,
                "--spec-method",
                "ngram",
                "--num-spec-tokens",
                str(K),
                "--spec-log",
                str(c.log_dir / f"spec{index}.jsonl"),
            )
        c.wait_healthy(engines=2)
        yield c
    finally:
        c.stop()


def prompts() -> list[str | list[int]]:
    """Repetitive text (lookups hit), random token ids (they mostly miss) and plain text."""
    rng = random.Random(7)
    repeated = "To be, or not to be, that is the question. " * 4
    return [
        repeated,
        [rng.randrange(3, 512) for _ in range(40)],
        "ROMEO: But soft, what light",
        repeated[5:],
        [rng.randrange(3, 512) for _ in range(9)] * 3,
        "First Citizen:\nBefore we proceed any further",
    ]


async def complete(session: aiohttp.ClientSession, url: str, prompt: str | list[int], stream: bool) -> dict:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    async with session.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        if not stream:
            return await r.json()
        chunks = [
            json.loads(line[6:]) for line in (await r.text()).splitlines() if line.startswith("data: {")
        ]
        return chunks[-1]


async def test_metrics_equal_spec_logs(spec_cluster: Cluster) -> None:
    """After a concurrent run on both engines, /metrics equals the sum of both spec logs exactly, and
    `vllm bench serve` arithmetic (sum over all series) gives the logs' acceptance rate."""
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(
            *(complete(s, spec_cluster.url, p, stream=i % 2 == 1) for i, p in enumerate(prompts() * 2))
        )
        log_paths = sorted(spec_cluster.log_dir.glob("spec*.jsonl"))
        text, logs = await metrics_matching_logs(s, spec_cluster.url, log_paths, K)
    assert not logs.malformed
    metrics = tally_metrics(text)
    assert set(logs.engines) == {0, 1}  # both engines drafted
    for engine in (0, 1):
        assert metrics[engine].bins(K, K + 1) == logs.engines[engine].bins(K, K + 1), engine
    everything = total(logs.engines.values())
    assert 0 < everything.num_accepted_tokens < everything.num_draft_tokens  # hits and misses

    # vllm bench serve: sum every series of each counter, then divide.
    def summed(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))

    rate = summed("vllm:spec_decode_num_accepted_tokens_total") / summed(
        "vllm:spec_decode_num_draft_tokens_total"
    )
    assert rate == pytest.approx(everything.num_accepted_tokens / everything.num_draft_tokens, abs=1e-12)

    # Per-request metrics in the responses add up to the same counts.
    per_request = [r["metrics"]["speculative_decoding"] for r in results if "metrics" in r]
    assert sum(m["num_spec_steps"] for m in per_request) == everything.num_drafts
    assert sum(m["num_accepted_draft_tokens"] for m in per_request) == everything.num_accepted_tokens

    # The checker agrees and exits 0.
    checker = subprocess.run(
        [
            sys.executable,
            "-m",
            "openinfer.tools.verify_log",
            "--metrics-url",
            f"{spec_cluster.url}/metrics",
            "--spec-log",
            *map(str, sorted(spec_cluster.log_dir.glob("spec*.jsonl"))),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checker.returncode == 0, checker.stdout + checker.stderr
    # The frontend logs the interval's line every --spec-log-interval (1 s): a bounded wait for it.
    log = spec_cluster.log_dir / "frontend.log"
    async with asyncio.timeout(30):
        while "SpecDecoding metrics: Mean acceptance length" not in log.read_text():
            await asyncio.sleep(0.1)


async def test_drafter_unload_and_reload_with_new_k(spec_cluster: Cluster) -> None:
    """Admin API on a real engine: unload, reload with K=3 (its position labels appear), K=33 refused;
    nothing ever goes down, and /metrics still equals the logs."""
    url = spec_cluster.url
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as s:
        async with s.get(f"{url}/metrics") as r:
            before = tally_metrics(await r.text())
        async with s.delete(f"{url}/admin/engines/1/drafter") as r:
            assert r.status == 200, await r.text()
        async with s.post(
            f"{url}/admin/engines/1/drafter", json={"method": "ngram", "num_spec_tokens": 3}
        ) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["num_spec_tokens"] == 3
        async with s.post(
            f"{url}/admin/engines/1/drafter", json={"method": "ngram", "num_spec_tokens": 33}
        ) as r:
            assert r.status == 400 and "32" in (await r.json())["error"]["message"]
        await asyncio.gather(*(complete(s, url, p, stream=False) for p in prompts() * 2))
        log_paths = sorted(spec_cluster.log_dir.glob("spec*.jsonl"))
        text, logs = await metrics_matching_logs(s, url, log_paths, K)
    after = tally_metrics(text)
    for engine in (0, 1):
        assert all(v >= 0 for v in after[engine].minus(before[engine]).bins(K, K + 1).values())
    assert re.search(
        r'vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*engine="1"[^}]*position="2"', text
    )
    for engine in (0, 1):
        assert after[engine].bins(K, K + 1) == logs.engines[engine].bins(K, K + 1), engine


async def test_a_drafter_outside_the_allowed_folders_is_refused_saying_nothing_of_the_files(
    spec_cluster: Cluster, tmp_path: Path
) -> None:
    """Admin API on a real engine (the allowed folders default to its model's): the built-in DFlash
    drafter, a real checkpoint outside them, and a path that does not exist get the same 400, naming only
    the path sent; the engine keeps drafting with its n-gram lookup."""
    answers = []
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as s:
        for path in (str(builtin_drafter_folder()), str(tmp_path / "missing")):
            body = {"method": "dflash", "num_spec_tokens": 3, "draft_model": path}
            async with s.post(f"{spec_cluster.url}/admin/engines/0/drafter", json=body) as r:
                answers.append((r.status, (await r.json())["error"]["message"].replace(path, "PATH")))
        async with s.get(f"{spec_cluster.url}/admin/engines") as r:
            engine0 = next(e for e in (await r.json())["engines"] if e["index"] == 0)
    assert answers[0] == answers[1] and answers[0][0] == 400, answers
    assert "not under a folder this engine loads drafters from (--allowed-drafter-dir)" in answers[0][1]
    assert engine0["num_spec_tokens"] == K


@pytest.mark.parametrize("method", ["dflash", "dspark"])
async def test_a_checkpoint_drafter_without_a_folder_is_refused_off_the_builtin_target(
    spec_cluster: Cluster, method: str
) -> None:
    """An engine serving another model than the built-in target has no drafter of its own: dflash or dspark
    with no `draft_model` is a 400 saying what to pass; the engine keeps drafting with its n-gram lookup."""
    async with aiohttp.ClientSession(headers=ADMIN_HEADERS) as s:
        body = {"method": method, "num_spec_tokens": 3}
        async with s.post(f"{spec_cluster.url}/admin/engines/0/drafter", json=body) as r:
            status, error = r.status, (await r.json())["error"]
        async with s.get(f"{spec_cluster.url}/admin/engines") as r:
            engine0 = next(e for e in (await r.json())["engines"] if e["index"] == 0)
    assert (status, error["code"]) == (400, "drafter_refused"), error
    assert error["message"] == (
        f"{method} needs a checkpoint folder (--draft-model PATH; `draft_model` in a run-time load): only the "
        "built-in target brings its own drafters"
    )
    assert engine0["num_spec_tokens"] == K
