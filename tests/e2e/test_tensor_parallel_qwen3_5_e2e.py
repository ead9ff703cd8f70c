"""A Qwen3.5 (hybrid Gated DeltaNet) engine over two CPU ranks (``-tp 2``) as real processes: greedy
completions equal a one-rank engine's, with n-gram speculation (state groups of 1 + K slots, the driver's
sizing carried to rank 1 by its RankSpec) and prefill in chunks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from tests.e2e.processes import Cluster
from tests.e2e.rank_processes import cluster_log, greedy_token_ids, rank_pids, stop_with_ranks

MAX_TOKENS = 16
# token prompts of the tiny model's 512-token vocabulary: repeats (n-gram lookups hit), random ids, and one
# prefilled in chunks of 16 tokens
PROMPTS = [[42] * 10, [11, 12] * 8, [64, 404, 303], [7] * 3 + list(range(200, 237))]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Cluster]]:
    """A frontend and an engine of the tiny Qwen3.5 model at -tp 1 without a drafter, and one at -tp 2 with
    n-gram K=3, prefilling in chunks of 16 tokens."""
    model = make_tiny_qwen3_5_checkpoint(tmp_path_factory.mktemp("q35"), seed=6)
    started = {tp: Cluster(tmp_path_factory.mktemp(f"tp{tp}")) for tp in (1, 2)}
    try:
        started[1].start_frontend()
        started[1].start_engine(model, 0, "-tp", "1")
        started[2].start_frontend()
        spec = ["--spec-method", "ngram", "--num-spec-tokens", "3"]
        started[2].start_engine(model, 0, "-tp", "2", "--max-num-batched-tokens", "16", *spec)
        for cluster in started.values():
            cluster.wait_healthy(timeout=120)
        yield started
    finally:
        for cluster in started.values():
            stop_with_ranks(cluster, 0)


async def test_two_ranks_complete_as_one(clusters: dict[int, Cluster]) -> None:
    """Greedy tokens of the -tp 2 n-gram engine equal the -tp 1 engine's on the same prompts; the sharded
    engine ran a rank process of its own."""
    one, two = [await greedy_token_ids(clusters[tp].url, PROMPTS, MAX_TOKENS) for tp in (1, 2)]
    assert two == one and all(len(tokens) == MAX_TOKENS for tokens in one)
    log = cluster_log(clusters[2], "engine0")
    assert len(rank_pids(log)) == 1 and "tensor parallel over 2 ranks" in log
