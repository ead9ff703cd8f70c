"""An engine over two CPU ranks (``-tp 2``, gloo on loopback) as real processes: greedy completions equal one
rank's behind a real frontend; a rank killed mid-stream ends its engine (the request gets the engine-death
error, no process is left) and openinfer-serve starts the whole group again; what cannot run at N > 1 is
refused at start with exit status 2 and the reason."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openinfer.engine_core.launch.local_cluster import python_module
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from tests.e2e.load import Load, first_tokens
from tests.e2e.processes import ADMIN_KEY, Cluster, kill_all, serve_children
from tests.e2e.rank_processes import greedy_token_ids, rank_pids, wait_gone
from tests.e2e.serve_under_test import gone

# Token prompts (the tiny model's 512-token vocabulary); the last is prefilled in chunks of 16 tokens.
PROMPTS = [[5, 6, 7, 8], [100, 3, 9], [7] * 3 + list(range(200, 237))]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[int, Cluster]]:
    """A frontend and an engine of -tp 1, and a frontend and an engine of -tp 2 (rank 1 a process of its
    own), both serving the tiny model with prefill chunks of 16 tokens."""
    started = {tp: Cluster(tmp_path_factory.mktemp(f"tp{tp}")) for tp in (1, 2)}
    try:
        for tp, cluster in started.items():
            cluster.start_frontend()
            cluster.start_engine(tiny_model, 0, "-tp", str(tp), "--max-num-batched-tokens", "16")
        for cluster in started.values():
            cluster.wait_healthy(timeout=120)
        yield started
    finally:
        for cluster in started.values():
            cluster.stop()
        kill_all(rank_pids(_log(started[2], "engine0")))


def _log(cluster: Cluster, name: str) -> str:
    assert cluster.log_dir is not None
    return (cluster.log_dir / f"{name}.log").read_text(errors="replace")


async def test_two_ranks_complete_as_one(clusters: dict[int, Cluster]) -> None:
    """Greedy tokens of -tp 2 equal -tp 1's on the same prompts (batched, one prefilled in chunks); the
    sharded engine ran a rank process of its own."""
    one, two = [await greedy_token_ids(clusters[tp].url, PROMPTS, MAX_TOKENS) for tp in (1, 2)]
    assert two == one and all(len(tokens) == MAX_TOKENS for tokens in one)
    log = _log(clusters[2], "engine0")
    assert len(rank_pids(log)) == 1 and "tensor parallel over 2 ranks" in log


def _engine(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """openinfer-engine with ``flags`` run to its end (bounded), for a start it must refuse."""
    argv = python_module("openinfer.engine_core.process.engine_cli", "--device", "cpu", *flags)
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=tmp_path)


def test_fake_model_on_two_ranks_is_refused(tmp_path: Path) -> None:
    """--fake-model with -tp 2 (no model to shard; every drafter runs at any N): exit status 2 and the
    reason, before any rank starts."""
    done = _engine(tmp_path, "--fake-model", "-tp", "2")
    assert done.returncode == 2 and "--fake-model has no model to shard" in done.stderr, done.stderr
    assert rank_pids(done.stderr) == []


def test_ranks_that_do_not_divide_the_heads_are_refused_with_no_rank_left(tmp_path: Path) -> None:
    """3 attention heads (over 1 KV head, which the ranks replicate) on 2 ranks: the model's own refusal,
    raised by rank 0 once its rank process started, ends the engine with status 2 and that message, and the
    rank process is gone."""
    overrides = {**SMALL_TEXT_QWEN3, "num_attention_heads": 3, "num_key_value_heads": 1}
    model = make_tiny_checkpoint(tmp_path / "three_heads", seed=3, overrides=overrides)
    done = _engine(tmp_path, "--model", str(model), "-tp", "2", "--kv-cache-gb", "0.05")
    pids = rank_pids(done.stderr)
    kill_all(pids)
    assert done.returncode == 2, done.stderr
    assert "--tensor-parallel-size 2 does not divide the model's 3 attention heads" in done.stderr
    assert len(pids) == 1 and gone(pids[0])


async def test_a_killed_rank_ends_its_engine_and_serve_starts_the_group_again(
    tmp_path: Path, tiny_model: Path
) -> None:
    """kill -9 of rank 1 while a request streams (n-gram drafting, K = 3): the stream ends with the
    engine-death error naming engine 0, the engine exits 1 with a line naming the rank, no process of the
    group is left, serve starts the engine (and so a new rank 1) again, the next request completes, and
    /metrics equals the spec log of both incarnations bin by bin (openinfer-verify-log --engines-url: the
    drafts the frontend counted, an unsent tail of the killed one's apart)."""
    cluster = Cluster(tmp_path)
    spec_log = tmp_path / "spec.jsonl"
    serve = cluster.start_serve(
        tiny_model, "-tp", "2", "--spec-method", "ngram", "--num-spec-tokens", "3", "--spec-log", spec_log,
        "--step-sleep", "0.05", "--engine-restart-backoff", "0.2", env={"OPENINFER_ADMIN_API_KEY": ADMIN_KEY},
    )  # fmt: skip
    seen: set[int] = set()
    try:
        cluster.wait_healthy(timeout=120)
        engine = serve_children(serve.pid)["engine0"]
        (rank,) = rank_pids(_serve_log(cluster))
        seen |= {engine, rank}
        load = Load(cluster.url, clients=0, timeout_s=60, model="tiny")
        # greedy on [11, 12] * 8: the tiny model's continuation repeats itself, so n-gram lookups hit
        body = {"model": "tiny", "prompt": [11, 12] * 8, "max_tokens": 200, "temperature": 0}
        body |= {"ignore_eos": True, "stream": True}
        async with aiohttp.ClientSession() as session:
            before = await first_tokens(session, cluster.url, "tiny")
            stream = asyncio.create_task(load.request(session, dict(body)))
            await wait_for_first_tokens_of(session, cluster.url, before + 1)
            async with asyncio.timeout(60):  # the killed incarnation has drafted
                while not spec_log.exists() or not spec_log.read_text():
                    await asyncio.sleep(0.05)
            os.kill(rank, signal.SIGKILL)
            outcome = await stream
            wait_gone([engine, rank])
            async with asyncio.timeout(120):  # serve restarts the engine, which starts its own rank 1
                while len(rank_pids(_serve_log(cluster))) < 2 or "engine0" not in serve_children(serve.pid):
                    await asyncio.sleep(0.1)
            seen |= set(rank_pids(_serve_log(cluster))) | set(serve_children(serve.pid).values())
            cluster.wait_healthy(timeout=120)
            short = {**body, "max_tokens": 16}
        # a new connection: the session's pooled ones sat idle through the restart, past the server's 5 s
        # keep-alive, and a reused one the server has closed fails the request (ServerDisconnectedError)
        async with aiohttp.ClientSession() as fresh:
            after = await load.request(fresh, short)
        assert outcome.kind == "engine_error" and "engine 0" in outcome.message, outcome
        log = _serve_log(cluster)
        assert f"rank 1 of 2 (pid {rank}) was killed by SIGKILL" in log
        assert "engine 0 exited with code 1; starting it again" in log, log[-3000:]
        assert after.kind == "ok", after
        assert serve.poll() is None and serve_children(serve.pid)["engine0"] != engine
        lines = spec_log.read_text().splitlines()
        assert len({json.loads(line)["incarnation"] for line in lines}) == 2  # drafts before and after
        verify = subprocess.run(
            python_module("openinfer.tools.verify_log", "--metrics-url", f"{cluster.url}/metrics")
            + ["--spec-log", str(spec_log), "--engines-url", f"{cluster.url}/admin/engines"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "OPENINFER_ADMIN_API_KEY": ADMIN_KEY},
        )  # fmt: skip
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        cluster.stop(30)
        kill_all(seen)
    wait_gone(sorted(seen))


async def wait_for_first_tokens_of(session: aiohttp.ClientSession, url: str, count: float) -> None:
    """Until ``count`` requests of "tiny" had their first token (a bounded wait)."""
    async with asyncio.timeout(60):
        while await first_tokens(session, url, "tiny") < count:
            await asyncio.sleep(0.1)


def _serve_log(cluster: Cluster) -> str:
    return _log(cluster, "serve")


async def test_a_hung_rank_ends_its_engine_after_the_rank_timeout(tmp_path: Path, tiny_model: Path) -> None:
    """SIGSTOP of rank 1 while a request streams: rank 0's next collective waits --rank-timeout (2 s), then
    the engine ends (exit 1, a line saying why), the stream gets the engine-death error, and the stopped rank
    is killed by its engine: nothing is left."""
    cluster = Cluster(tmp_path)
    try:
        cluster.start_frontend()
        engine = cluster.start_engine(
            tiny_model, 0, "-tp", "2", "--rank-timeout", "2", "--step-sleep", "0.05"
        )
        cluster.wait_healthy(timeout=120)
        (rank,) = rank_pids(_log(cluster, "engine0"))
        load = Load(cluster.url, clients=0, timeout_s=60, model="tiny")
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True, "stream": True}
        async with aiohttp.ClientSession() as session:
            before = await first_tokens(session, cluster.url, "tiny")
            stream = asyncio.create_task(load.request(session, dict(body)))
            await wait_for_first_tokens_of(session, cluster.url, before + 1)
            os.kill(rank, signal.SIGSTOP)
            outcome = await stream
        assert engine.wait(60) == 1
        wait_gone([rank])
        assert outcome.kind == "engine_error" and "engine 0" in outcome.message, outcome
        assert "kept the others waiting past --rank-timeout 2 s during a step" in _log(cluster, "engine0")
    finally:
        cluster.stop()
        kill_all(rank_pids(_log(cluster, "engine0")))


async def test_prefix_cache_logprobs_grammar_and_penalties_are_unchanged_on_two_ranks(
    clusters: dict[int, Cluster],
) -> None:
    """A 50-token prompt (3 full blocks of 16) sent twice, the second served from the prefix cache, with 2
    logprobs per token, a regex constraint and penalties: -tp 2 returns -tp 1's tokens, text and logprobs
    (within float32 noise), and its /metrics count the cached tokens."""
    body = {
        "model": "tiny",
        "prompt": list(range(300, 350)),
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": 2,
    }
    body |= {"presence_penalty": 0.5, "repetition_penalty": 1.2, "return_token_ids": True}
    body |= {"structured_outputs": {"regex": "[a-z]+"}}
    answers: dict[int, list[Any]] = {}
    async with aiohttp.ClientSession() as session:
        for tp, cluster in clusters.items():
            answers[tp] = []
            for _ in range(2):
                async with session.post(f"{cluster.url}/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    answers[tp].append((await r.json())["choices"][0])
        async with session.get(f"{clusters[2].url}/metrics") as r:
            metrics = await r.text()
    for one, two in zip(answers[1], answers[2], strict=True):
        assert two["token_ids"] == one["token_ids"] and two["text"] == one["text"]
        assert str(two["text"]).isalpha()  # the regex held
        ones, twos = one["logprobs"]["token_logprobs"], two["logprobs"]["token_logprobs"]
        assert len(ones) == len(twos) and all(abs(a - b) < 1e-4 for a, b in zip(ones, twos, strict=True))
    hits = [
        s.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "vllm:prefix_cache_hits"
        for s in family.samples
        if s.name.endswith("_total")
    ]
    assert sum(hits) >= 48  # the second request's 3 full blocks
