"""Block drafters on an engine over two CPU ranks (``-tp 2 --spec-method dflash|dspark``, gloo on loopback),
drafting on rank 0 with its own copy of the target's embedding and LM head, as real processes: greedy
completions equal a one-rank engine's without speculation, drafts are accepted, /metrics equals the spec log
bin by bin, and DFlash drafts round by round as it does at -tp 1 (its inputs are the same numbers)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import aiohttp
import pytest

from openinfer.engine_core.testing.dflash_checkpoint import make_accepting_dflash_pair
from openinfer.engine_core.testing.dspark_checkpoint import make_tiny_dspark_checkpoint
from openinfer.protocol.spec_log import parse_spec_log_line
from openinfer.tools.spec_tally import tally_metrics
from tests.e2e.processes import Cluster
from tests.e2e.rank_processes import cluster_log, greedy_token_ids, rank_pids, stop_with_ranks
from tests.e2e.settled_metrics import metrics_matching_logs

K = 4
MAX_TOKENS = 24
# greedy continuations of the repeating target; one prefilled in chunks of 16 tokens
PROMPTS = [
    [42] * 10,
    [11, 12] * 8,
    [64, 104, 203],
    [34, 12, 66, 53, 170, 76, 155, 64, 204, 94, 30, 7, 5, 9, 150, 8, 77],
]
# name: (-tp, drafter flags); "reference" has none
ENGINES = {
    "reference": ("1", ()),
    "dflash1": ("1", ("dflash",)),
    "dflash2": ("2", ("dflash",)),
    "dspark2": ("2", ("dspark",)),
}


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Cluster]]:
    """A frontend and one engine each over the accepting tiny Qwen3 target: "reference" at -tp 1 without a
    drafter, "dflash1" / "dflash2" with its DFlash drafter at -tp 1 / 2, "dspark2" with a DSpark drafter at
    -tp 2; K = 4, spec logs, prefill in chunks of 16 tokens."""
    folder = tmp_path_factory.mktemp("pair")
    target, dflash = make_accepting_dflash_pair(folder)
    dspark = make_tiny_dspark_checkpoint(folder / "s", target, seed=2, block_size=7, init_std=0.02)
    drafters = {"dflash": dflash, "dspark": dspark}
    started = {name: Cluster(tmp_path_factory.mktemp(name)) for name in ENGINES}
    try:
        for name, (tp, method) in ENGINES.items():
            cluster = started[name]
            assert cluster.log_dir is not None
            cluster.start_frontend()
            flags = ["-tp", tp, "--max-num-batched-tokens", "16"]
            for m in method:
                flags += ["--spec-method", m, "--draft-model", str(drafters[m]), "--num-spec-tokens", str(K)]
                flags += ["--spec-log", str(cluster.log_dir / "spec0.jsonl")]
            cluster.start_engine(target, 0, *flags)
        for cluster in started.values():
            cluster.wait_healthy(timeout=120)
        yield started
    finally:
        for cluster in started.values():
            stop_with_ranks(cluster, 0)


async def _lossless_and_counted(cluster: Cluster, reference: list[list[int]]) -> dict[str, int]:
    """Completions on ``cluster`` equal ``reference``; its /metrics equals its spec log bin by bin; the bins."""
    assert cluster.log_dir is not None
    assert await greedy_token_ids(cluster.url, PROMPTS, MAX_TOKENS, batched=False) == reference
    async with aiohttp.ClientSession() as session:
        text, logs = await metrics_matching_logs(session, cluster.url, [cluster.log_dir / "spec0.jsonl"], K)
    assert not logs.malformed and set(logs.engines) == {0}
    bins = logs.engines[0].bins(K, K + 1)
    assert tally_metrics(text)[0].bins(K, K + 1) == bins
    return bins


def _rounds(cluster: Cluster) -> list[list[tuple[int, int, int | None]]]:
    """Per request, in the order the requests came, its rounds' (verified, accepted, proposed) counts."""
    assert cluster.log_dir is not None
    rounds: dict[str, list[tuple[int, int, int | None]]] = defaultdict(list)
    for line in (cluster.log_dir / "spec0.jsonl").read_text().splitlines():
        parsed = parse_spec_log_line(line)
        rounds[parsed.request_id].append(
            (parsed.num_draft_tokens, parsed.num_accepted, parsed.num_proposed_tokens)
        )
    return list(rounds.values())


async def test_dflash_on_two_ranks_is_lossless_counted_and_drafts_as_one(
    clusters: dict[str, Cluster],
) -> None:
    """-tp 2 with DFlash K=4: greedy tokens equal -tp 1's without speculation, drafts are accepted, /metrics
    equals the spec log bin by bin, every round's counts equal -tp 1 DFlash's, and rank 0 logged its copy."""
    reference = await greedy_token_ids(clusters["reference"].url, PROMPTS, MAX_TOKENS, batched=False)
    assert all(len(tokens) == MAX_TOKENS for tokens in reference)
    bins = await _lossless_and_counted(clusters["dflash2"], reference)
    assert bins["drafts"] > 0 and bins["accepted_tokens"] > 0
    await _lossless_and_counted(clusters["dflash1"], reference)
    two, one = _rounds(clusters["dflash2"]), _rounds(clusters["dflash1"])
    assert len(two) == len(PROMPTS) and two == one
    log = cluster_log(clusters["dflash2"], "engine0")
    assert len(rank_pids(log)) == 1 and "rank 0: drafter's embedding/LM head copy" in log


async def test_dspark_on_two_ranks_is_lossless_and_counted(clusters: dict[str, Cluster]) -> None:
    """-tp 2 with a DSpark drafter (Markov and confidence heads) K=4: greedy tokens equal -tp 1's without
    speculation and /metrics equals the spec log bin by bin."""
    reference = await greedy_token_ids(clusters["reference"].url, PROMPTS, MAX_TOKENS, batched=False)
    bins = await _lossless_and_counted(clusters["dspark2"], reference)
    assert bins["drafts"] > 0
