"""An engine over two GPUs (``--gpu 0,1 -tp 2``: NCCL for the model's collectives) behind a real frontend: its
greedy tokens equal a one-GPU engine's and transformers'. Needs two CUDA devices (`benchmarks/gpu_check.sh`
runs the gpu-marked tests where a machine has them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.launch.local_cluster import python_module
from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy
from tests.e2e.processes import Cluster
from tests.e2e.rank_processes import greedy_token_ids, stop_with_ranks

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


async def test_two_gpus_complete_as_one(gpu_clusters: dict[int, Cluster], tiny_model: Path) -> None:
    """Greedy tokens over two GPUs (NCCL all-reduces and the logits all-gather) equal one GPU's, and are
    transformers' greedy tokens (teacher-forced)."""
    one, two = [await greedy_token_ids(gpu_clusters[tp].url, PROMPTS, MAX_TOKENS) for tp in (1, 2)]
    assert two == one
    assert_hf_greedy(tiny_model, PROMPTS, two)
