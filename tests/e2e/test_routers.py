"""PyPI's vllm-router in front of two ``openinfer-serve`` nodes (the built-in model), for real: under
``kv_aware``, fed by the nodes' KV events, a shared-prefix group lands on the node that holds its blocks
(seeded on the node a tie would not pick) and unrelated concurrent prompts spread over both; ``cache_aware``
keeps a group on one node and spreads unrelated load; ``round_robin`` alternates. Every response through the
router (completions, chat, streams) is the one a node gives directly. At the end, the two nodes' /metrics
summed equal their spec logs summed, bin by bin (speculation is on: the built-in DFlash drafter)."""

from __future__ import annotations

import json
import random
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from openinfer.benchmarks.fleet import Fleet, Node, router_binary
from openinfer.engine_core.builtin_model import BUILTIN_MODEL_NAME
from openinfer.frontend.metrics.spec_decode.acceptance_tally import AcceptanceTally
from openinfer.tools.spec_tally import read_spec_logs, scrape_metrics, tally_metrics
from tests.kv_event_reader import EventReader

pytestmark = [
    pytest.mark.skipif(
        router_binary() is None, reason="vllm-router is not installed (pip install vllm-router)"
    ),
    pytest.mark.timeout(600),
]

WAIT_S = 30.0  # a failure, never a hang
WORDS = "river stone cloud lamp tiger orange violin paper window garden silver rocket candle forest".split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def complete(url: str, prompt: str, max_tokens: int = 8) -> str:
    body = {"model": BUILTIN_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return str(post(url, "/v1/completions", body)["choices"][0]["text"])


def chat(url: str, content: str) -> str:
    body = {"model": BUILTIN_MODEL_NAME, "messages": [{"role": "user", "content": content}]}
    body |= {"max_tokens": 8, "temperature": 0}
    return str(post(url, "/v1/chat/completions", body)["choices"][0]["message"]["content"])


def stream_complete(url: str, prompt: str) -> str:
    body = {"model": BUILTIN_MODEL_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    pieces = []
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response:
            data = line.decode().strip().removeprefix("data: ")
            if data and data != "[DONE]":
                pieces.append(json.loads(data)["choices"][0]["text"])
    return "".join(pieces)


def which_node(fleet: Fleet, send: Callable[[], str]) -> tuple[int, str]:
    """The node that served one request sent alone, and its text (by the nodes' finished requests)."""
    before = fleet.served()
    result = send()
    deadline = time.monotonic() + WAIT_S
    while sum(after := fleet.served()) == sum(before):
        assert time.monotonic() < deadline, "no node counted the request"
        time.sleep(0.02)
    [node] = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
    return node, result


def spread(fleet: Fleet, prompts: list[str]) -> list[int]:
    """Requests each node served of ``prompts`` sent through the router at once."""
    before = fleet.served()
    with ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(lambda p: complete(fleet.url, p, max_tokens=24), prompts))
    deadline = time.monotonic() + WAIT_S
    while sum(after := fleet.served()) < sum(before) + len(prompts):
        assert time.monotonic() < deadline, "the nodes did not count every request"
        time.sleep(0.02)
    return [a - b for a, b in zip(after, before, strict=True)]


def wait_router_knows(fleet: Fleet, node: Node, reader: EventReader, prompt: str) -> None:
    """Until the router has applied the node's KV events up to those storing ``prompt``'s full blocks."""
    tokens = post(node.url, "/tokenize", {"model": BUILTIN_MODEL_NAME, "prompt": prompt})["tokens"]
    blocks = {tuple(tokens[i : i + 16]) for i in range(0, len(tokens) - 16, 16)}
    deadline = time.monotonic() + WAIT_S
    while not blocks <= set(reader.view.tokens[h] for h in reader.view.hashes):
        assert time.monotonic() < deadline, "the node never published the prompt's blocks"
        reader.poll(0.05)
        reader.catch_up()
    while fleet.router_applied(node) < reader.batches[-1].sequence:
        assert time.monotonic() < deadline, (
            f"the router never applied the node's events:\n{fleet.router_log()[-3000:]}"
        )
        time.sleep(0.02)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("fleet"), 2, None) as fleet:
        yield fleet


@pytest.fixture
def routed(fleet: Fleet, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    fleet.start_router(request.param)
    try:
        yield fleet
    finally:
        fleet.stop_router()


@pytest.mark.parametrize("routed", ["kv_aware"], indirect=True)
def test_kv_aware_follows_the_kv_events(routed: Fleet) -> None:
    """A group seeded on node 1 (node 0 wins ties) and one on node 0: their later requests land there;
    unrelated prompts sent at once spread over both; every text equals node 0's own answer."""
    fleet, rng = routed, random.Random(0)
    readers = [EventReader(node.events, node.replay) for node in fleet.nodes]
    answers: list[tuple[str, str]] = []
    try:
        for seed in (1, 0):
            prefix = text(rng, 60)
            first = f"{prefix} {text(rng, 5)}"
            complete(fleet.nodes[seed].url, first)  # straight to the node: only its events tell the router
            wait_router_knows(fleet, fleet.nodes[seed], readers[seed], first)
            for _ in range(2):
                prompt = f"{prefix} {text(rng, 5)}"
                node, answer = which_node(fleet, lambda p=prompt: complete(fleet.url, p))  # type: ignore[misc]
                assert node == seed, f"a request of the group seeded on node {seed} went to node {node}"
                answers.append((prompt, answer))
        assert all(spread(fleet, [text(rng, 40) for _ in range(6)]))
    finally:
        for reader in readers:
            reader.close()
    for prompt, answer in answers:
        assert complete(fleet.nodes[0].url, prompt) == answer


@pytest.mark.parametrize("routed", ["cache_aware"], indirect=True)
def test_cache_aware_keeps_a_group_on_one_node(routed: Fleet) -> None:
    """Each request of a group, sent one after another, lands where the first did; unrelated prompts sent
    at once spread over both nodes."""
    fleet, rng = routed, random.Random(1)
    prefix = text(rng, 60)
    nodes = [which_node(fleet, lambda: complete(fleet.url, f"{prefix} {text(rng, 5)}"))[0] for _ in range(4)]
    assert len(set(nodes)) == 1, nodes
    assert all(spread(fleet, [text(rng, 40) for _ in range(6)]))


@pytest.mark.parametrize("routed", ["round_robin"], indirect=True)
def test_round_robin_alternates_with_exact_answers(routed: Fleet) -> None:
    """Completions, chat and a stream through the router alternate over the nodes, each answer the one a
    node gives directly."""
    fleet, rng = routed, random.Random(2)
    direct = fleet.nodes[0].url
    sends: list[tuple[Callable[[str], str], Callable[[str], str], str]] = [
        (complete, complete, text(rng, 20)),
        (chat, chat, text(rng, 20)),
        (stream_complete, complete, text(rng, 20)),
        (complete, complete, text(rng, 20)),
    ]
    routed_answers = [
        which_node(fleet, lambda c=routed_call, p=prompt: c(fleet.url, p))  # type: ignore[misc]
        for routed_call, _, prompt in sends
    ]
    nodes = [node for node, _ in routed_answers]
    assert sorted(nodes) == [0, 0, 1, 1] and nodes[0] != nodes[1], nodes
    for (_, direct_call, prompt), (_, answer) in zip(sends, routed_answers, strict=True):
        assert answer == direct_call(direct, prompt)


def tallies(node: Node) -> tuple[AcceptanceTally, AcceptanceTally]:
    """A node's engine 0 as its /metrics counts it and as its spec log does (empty when it has none yet)."""
    assert node.cluster.log_dir is not None
    logs = read_spec_logs(sorted(node.cluster.log_dir.glob("spec-logs/*.jsonl")))
    return tally_metrics(scrape_metrics(f"{node.url}/metrics")).get(0, AcceptanceTally()), logs.engines.get(
        0, AcceptanceTally()
    )


def same(a: AcceptanceTally, b: AcceptanceTally) -> bool:
    k = max(a.num_spec_tokens, b.num_spec_tokens, len(a.per_pos), len(b.per_pos))
    return a.bins(k, k + 1) == b.bins(k, k + 1)


def test_two_nodes_metrics_sum_to_their_spec_logs(fleet: Fleet) -> None:
    """After every request above (run first: this module's tests share the nodes), each node's /metrics
    equals its spec log, and the two summed (what a fleet dashboard adds up) equal the logs summed."""
    complete(fleet.url, text(random.Random(3), 30), max_tokens=24)  # drafts, even when run alone
    deadline = time.monotonic() + WAIT_S
    while True:
        pairs = [tallies(node) for node in fleet.nodes]
        if all(same(*pair) for pair in pairs):
            break
        assert time.monotonic() < deadline, pairs
        time.sleep(0.1)
    total_scraped, total_logged = AcceptanceTally(), AcceptanceTally()
    for scraped, logged in pairs:
        total_scraped.add(scraped)
        total_logged.add(logged)
    assert total_scraped.num_drafts > 0 and same(total_scraped, total_logged)
