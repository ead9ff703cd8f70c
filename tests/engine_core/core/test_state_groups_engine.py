"""A hybrid engine whose memory holds fewer state groups than --max-num-seqs: requests wait for a group,
an abort gives its group back, and every request's tokens are those it gets alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from openinfer.protocol import EngineCoreRequest, SamplingParams

# 100 KiB: half of it holds one group (a 16.5 KiB slot and its prefix slot) beside the scratch slot
SMALL_BUDGET_GB = 100 * 2**10 / 2**30


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "t", seed=3)


def test_requests_wait_for_a_group_and_an_abort_frees_one(target: Path) -> None:
    """One state group: of three requests one runs at a time (the load snapshot reads full while it runs);
    aborting the running one lets the next in; the other two end with the tokens they get alone."""
    core = make_core(target, kv_cache_gb=SMALL_BUDGET_GB, max_num_seqs=8)
    assert core.runner.state_geometry is not None and core.runner.state_geometry.num_groups == 1
    prompts = [[5, 6, 7, 8], list(range(20, 40)), [9] * 6]
    alone = [generate_greedy(make_core(target), [p], 8)[0] for p in prompts]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    outputs: dict[str, list[int]] = {"1": [], "2": []}
    core.step()
    snapshot = core.load_snapshot()
    assert (snapshot.num_running_reqs, snapshot.num_waiting_reqs) == (1, 2)
    assert snapshot.kv_used_blocks == snapshot.kv_total_blocks  # the one group is in use
    core.abort(["0"])
    for _ in range(100):  # bounded: two requests of 8 tokens
        for out in core.step():
            if out.request_id in outputs:
                outputs[out.request_id] += out.new_token_ids
        assert len(core.scheduler.running) <= 1
        if not core.has_work:
            break
    assert [outputs["1"], outputs["2"]] == alone[1:]
