"""An engine over two GPUs (``--gpu 0,1 -tp 2``: NCCL for the model's collectives) behind a real frontend: its
greedy tokens equal a one-GPU engine's and transformers'. Needs two CUDA devices (`benchmarks/gpu_check.sh`
runs the gpu-marked tests where a machine has them)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import torch

from openinfer.engine_core.launch.local_cluster import python_module
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from tests.e2e.processes import Cluster
from tests.e2e.rank_processes import stop_with_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]

PROMPTS = [[5, 6, 7, 8], [100, 3, 9], [7] * 3 + list(range(200, 237))]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def gpu_clusters(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[int, Cluster]]:
    """A frontend and a float32 engine on GPU 0, and a frontend and one over GPUs 0 and 1 (-tp 2)."""
    started = {tp: Cluster(tmp_path_factory.mktemp(f"cuda-tp{tp}")) for tp in (1, 2)}
    try:
        for tp, cluster in started.items():
            cluster.start_frontend()
            gpus = ",".join(str(i) for i in range(tp))
            argv = python_module(
                "openinfer.engine_core.process.engine_cli", "--gpu", gpus, "-tp", str(tp), "--dtype", "float32",
                "--model", str(tiny_model), "--served-model-name", "tiny", "--gpu-memory-utilization", "0.1",
                "--frontend", f"tcp://127.0.0.1:{cluster.engine_port}",
            )  # fmt: skip
            cluster.spawn("engine0", argv)
        for cluster in started.values():
            cluster.wait_healthy(timeout=180)
        yield started
    finally:
        for cluster in started.values():
            stop_with_ranks(cluster, 0)


async def _completions(url: str) -> list[list[int]]:
    async def one(session: aiohttp.ClientSession, prompt: list[int]) -> list[int]:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        body |= {"ignore_eos": True, "return_token_ids": True}
        async with session.post(f"{url}/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            tokens: list[int] = (await r.json())["choices"][0]["token_ids"]
            return tokens

    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(one(session, p) for p in PROMPTS)))


async def test_two_gpus_complete_as_one(gpu_clusters: dict[int, Cluster], tiny_model: Path) -> None:
    """Greedy tokens over two GPUs (NCCL all-reduces and the logits all-gather) equal one GPU's, and are
    transformers' greedy tokens (teacher-forced)."""
    one, two = [await _completions(gpu_clusters[tp].url) for tp in (1, 2)]
    assert two == one
    assert_hf_greedy(tiny_model, PROMPTS, two)
