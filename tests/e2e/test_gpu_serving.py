"""A real engine on a GPU (`--gpu 0`) behind the frontend: the tokens are transformers' greedy tokens, and its
KV cache is sized by --gpu-memory-utilization."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import torch
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.core.kv_sizing import GIB
from openinfer.engine_core.launch.local_cluster import python_module
from tests.e2e.processes import Cluster

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

UTILIZATION = 0.1  # of the GPU's memory, for the engine: its KV cache is what the weights and the rest leave


@pytest.fixture(scope="module")
def free_before() -> int:
    """Free device memory before the engine starts (this process's CUDA context already taken)."""
    return torch.cuda.mem_get_info()[0]


@pytest.fixture(scope="module")
def gpu_cluster(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, free_before: int
) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("gpu-logs"))
    try:
        c.start_frontend()
        c.spawn(
            "engine0",
            python_module(
                "openinfer.engine_core.process.engine_cli",
                "--gpu",
                "0",
                "--dtype",
                "float32",
                "--model",
                str(tiny_model),
                "--served-model-name",
                "tiny",
                "--frontend",
                f"tcp://127.0.0.1:{c.engine_port}",
                "--gpu-memory-utilization",
                str(UTILIZATION),
            ),
        )
        c.wait_healthy(120)
        yield c
    finally:
        c.stop()


async def test_gpu_engine_tokens_are_transformers_greedy(gpu_cluster: Cluster, tiny_model: Path) -> None:
    """Greedy output of a --gpu 0 engine, teacher-forced through HF on the CPU, is HF's argmax everywhere."""
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{gpu_cluster.url}/v1/completions",
            json={
                "prompt": "ROMEO: But soft",
                "max_tokens": 24,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        ) as r:
            body = await r.json()
    assert r.status == 200, body
    choice = body["choices"][0]
    prompt_ids, output_ids = choice["prompt_token_ids"], choice["token_ids"]
    hf = Qwen3ForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt_ids + output_ids])).logits[0]
    for i, token in enumerate(output_ids):
        row = logits[len(prompt_ids) - 1 + i]
        assert (row.max() - row[token]).item() <= 1e-3


def test_gpu_memory_utilization_sizes_the_kv_cache(gpu_cluster: Cluster, free_before: int) -> None:
    """Without --kv-cache-gb the engine logs the arithmetic of its KV cache; the device memory it took holds
    that KV cache and stays within its share of the GPU (plus its own CUDA context, taken before it counts)."""
    log = (gpu_cluster.log_dir / "engine0.log").read_text()
    found = re.search(rf"KV cache ([0-9.]+) GiB = .* \(--gpu-memory-utilization {UTILIZATION:g}\)", log)
    assert found, log
    kv_bytes = float(found.group(1)) * GIB
    free_after, total = torch.cuda.mem_get_info()
    taken = free_before - free_after
    assert 0.99 * kv_bytes <= taken <= UTILIZATION * total + GIB, (taken / GIB, kv_bytes / GIB, total / GIB)
