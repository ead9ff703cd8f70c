"""KV events on real ZMQ sockets, read by a consumer written from vLLM's description (tests/kv_event_reader.py):
after every step, replaying the stream gives exactly the engine's set of cached block hashes, through
eviction, preemption and a failed step, with a DFlash drafter on (drafts never appear as stored blocks) and on
a hybrid Qwen3.5 target; a restarted engine's stream starts again from sequence 0 with AllBlocksCleared; the
replay socket serves its kept batches and ends with -1."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from openinfer.engine_core.builtin_model import builtin_drafter_folder, builtin_target_folder
from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.kv_events_config import KVEventsConfig
from openinfer.engine_core.launch.local_cluster import free_port_pair
from openinfer.engine_core.process.kv_event_publisher import KVEventPublisher
from openinfer.engine_core.request import Request
from openinfer.engine_core.testing.engine_cores import make_core
from openinfer.engine_core.testing.qwen3_5_checkpoint import make_tiny_qwen3_5_checkpoint
from openinfer.protocol import EngineCoreRequest, SamplingParams
from openinfer.protocol.kv_events import external_block_hash
from tests.kv_event_reader import EventReader, Stored

WAIT_S = 10.0  # a failure, never a hang
BLOCK = 16


def events_config(port: int, **overrides: object) -> KVEventsConfig:
    options = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}"}
    options["replay_endpoint"] = f"tcp://127.0.0.1:{port + 1}"
    return KVEventsConfig(**{**options, **overrides})  # type: ignore[arg-type]


class Engine:
    """An engine core and its publisher, stepped by the test as the engine process steps them."""

    def __init__(self, core: EngineCore) -> None:
        assert core.config.kv_events_config is not None
        self.core = core
        self.context = zmq.Context()
        self.publisher = KVEventPublisher(core.config.kv_events_config, 0, self.context)
        self.published = 0  # batches handed to the publisher
        self.finished: list[list[int]] = []  # each finished request's prompt and output

    def publish(self) -> None:
        assert self.core.kv_cache.event_log is not None
        events = self.core.kv_cache.event_log.take()
        self.publisher.publish(events)
        self.published += bool(events)

    def cached_hashes(self) -> set[int]:
        return {external_block_hash(key) for key in self.core.kv_cache._cached}

    def close(self) -> None:
        self.publisher.close()
        self.context.destroy(linger=0)


def read_up_to(reader: EventReader, count: int) -> None:
    """Read until the reader holds ``count`` batches of this process (gaps filled by replay)."""
    deadline = time.monotonic() + WAIT_S
    while len(reader.batches) < count:
        assert time.monotonic() < deadline, f"read {len(reader.batches)} of {count} batches"
        reader.poll(0.05)
        if len(reader.batches) < count:
            reader.catch_up()


def run_checked(engine: Engine, reader: EventReader, waves: list[list[list[int]]], max_tokens: int) -> None:
    """Each wave's requests to completion; after every step the reader's view equals the engine's cache."""
    core = engine.core
    for w, wave in enumerate(waves):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        outputs: dict[str, list[int]] = {}
        for i, prompt in enumerate(wave):
            core.add_request(EngineCoreRequest(f"{w}-{i}", prompt, params))
            outputs[f"{w}-{i}"] = list(prompt)
        for _ in range(1000):  # bounded: every request ends within max_tokens steps past its prompt
            for out in core.step():
                outputs[out.request_id] += out.new_token_ids
            engine.publish()
            read_up_to(reader, engine.published)
            assert reader.view.hashes == engine.cached_hashes()
            if not core.has_work:
                break
        engine.finished += outputs.values()


def assert_stored_only_verified_tokens(reader: EventReader, finished: list[list[int]]) -> None:
    """Every stored block's whole prefix (its chain of parents) is a prefix of some request's prompt and
    output: no draft token and no drafter context ever reached the stream."""
    prefix_of: dict[int, tuple[int, ...]] = {}
    sequences = [tuple(tokens) for tokens in finished]
    for batch in reader.batches:
        for event in batch.events:
            if not isinstance(event, Stored):
                continue
            parent = prefix_of[event.parent] if event.parent is not None else ()
            for i, block_hash in enumerate(event.hashes):
                parent = parent + tuple(event.token_ids[i * BLOCK : (i + 1) * BLOCK])
                prefix_of[block_hash] = parent
                assert any(s[: len(parent)] == parent for s in sequences), (
                    "a stored block no request computed"
                )
    assert prefix_of, "nothing was stored"


@pytest.fixture
def port() -> int:
    return free_port_pair()


@pytest.fixture
def reader(port: int) -> Iterator[EventReader]:
    reader = EventReader(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
    yield reader
    reader.close()


def prompts(rng: random.Random, shared: list[int], n: int) -> list[list[int]]:
    return [shared + [rng.randrange(3, 500) for _ in range(rng.randrange(5, 40))] for _ in range(n)]


def test_eviction_preemption_and_drafts(port: int, reader: EventReader) -> None:
    """The built-in model with its DFlash drafter (K=7) in 12 blocks: shared prefixes are stored once,
    evicted and stored again, requests are preempted; the view equals the cache after every step, and every
    stored block holds verified tokens only."""
    rng = random.Random(0)
    core = make_core(
        builtin_target_folder(),
        num_kv_blocks=12,
        max_num_batched_tokens=2048,
        speculative=DrafterSpec("dflash", 7, builtin_drafter_folder("dflash")),
        kv_events_config=events_config(port),
    )
    preempted: list[str] = []
    preempt = core.scheduler._preempt

    def preempt_and_note(request: Request) -> None:
        preempted.append(request.request_id)
        preempt(request)

    core.scheduler._preempt = preempt_and_note  # type: ignore[method-assign]
    engine = Engine(core)
    try:
        shared = [rng.randrange(3, 500) for _ in range(40)]
        waves = [prompts(rng, shared, 3), prompts(rng, [], 2), prompts(rng, shared, 3)]
        run_checked(engine, reader, waves, max_tokens=24)
        assert preempted, "the 12 blocks never ran short"
        removed = [
            e for b in reader.batches for e in b.events if not isinstance(e, Stored) and e[0] == "removed"
        ]
        assert removed, "nothing was evicted"
        assert_stored_only_verified_tokens(reader, engine.finished)
        core.fail_running("a failed step")  # the cache is forgotten: AllBlocksCleared
        engine.publish()
        read_up_to(reader, engine.published)
        assert reader.batches[-1].events == [("cleared",)] and reader.view.hashes == set()
    finally:
        engine.close()


@pytest.fixture(scope="module")
def qwen3_5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "t", seed=3)


def test_hybrid_qwen3_5_target(port: int, reader: EventReader, qwen3_5: Path) -> None:
    """A hybrid target (Gated DeltaNet state beside its paged KV) in 48 blocks: the view equals the cache
    after every step, through evictions, and a shared prefix of 160 tokens (past the state kept at 144) is
    hit."""
    rng = random.Random(1)
    core = make_core(
        qwen3_5, num_kv_blocks=48, max_num_batched_tokens=2048, kv_events_config=events_config(port)
    )
    engine = Engine(core)
    try:
        shared, other = ([rng.randrange(3, 200) for _ in range(160)] for _ in range(2))
        run_checked(
            engine, reader, [prompts(rng, shared, 1), prompts(rng, shared, 2), prompts(rng, other, 4)], 8
        )
        assert core.kv_cache.counters is not None and core.kv_cache.counters.hits > 0
        assert any(e[0] == "removed" for b in reader.batches for e in b.events if not isinstance(e, Stored))
        assert_stored_only_verified_tokens(reader, engine.finished)
    finally:
        engine.close()


def test_restart_starts_from_sequence_zero_and_clears(port: int, reader: EventReader) -> None:
    """An engine that ends and starts again on the same endpoints: the reader sees the sequence go back,
    replays the new stream from 0 (AllBlocksCleared first), and its view equals the new cache."""
    first = Engine(make_core(builtin_target_folder(), kv_events_config=events_config(port)))
    try:
        run_checked(first, reader, [[list(range(3, 23))]], 100)  # a block stored every 16 tokens: 7 batches
        assert reader.view.hashes  # blocks of the first process
    finally:
        first.close()
    second = Engine(make_core(builtin_target_folder(), kv_events_config=events_config(port)))
    try:
        # The reader's SUB finds the new socket by itself, missing what was sent before it did: the new
        # process's requests go on until a batch it reads shows the sequence gone back (fewer batches than
        # the first process), and it replays the rest.
        deadline = time.monotonic() + WAIT_S
        for n in range(100):  # bounded by the deadline; each request adds a few batches
            params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
            second.core.add_request(EngineCoreRequest(str(n), list(range(30 + n, 50 + n)), params))
            while second.core.has_work:
                second.core.step()
                second.publish()
            reader.poll(0.1)
            if len(reader.batches) == second.published and reader.view.hashes == second.cached_hashes():
                break
            assert time.monotonic() < deadline, "the restart was never seen"
        assert reader.batches[0].events[0] == ("cleared",)
        assert [b.sequence for b in reader.batches] == list(range(second.published))
        assert reader.view.hashes == second.cached_hashes() and reader.view.hashes
    finally:
        second.close()


def test_replay_serves_the_kept_batches(port: int, reader: EventReader) -> None:
    """buffer_steps 3: a replay from 0 answers the last three batches, in order, then -1; a malformed
    request is dropped and the socket still answers."""
    engine = Engine(make_core(builtin_target_folder(), kv_events_config=events_config(port, buffer_steps=3)))
    try:
        run_checked(engine, reader, [[list(range(3, 23))]], 100)  # 7 batches
        assert engine.published > 3
        live = {b.sequence: reader.payloads[b.sequence] for b in reader.batches}
        bad = reader.context.socket(zmq.DEALER)
        bad.connect(reader.replay_endpoint)
        bad.send_multipart((b"", b"short"))
        bad.close(linger=1000)
        replayed = reader.replay(0)
        last = engine.published - 1
        assert [s for s, _ in replayed] == [last - 2, last - 1, last]
        assert all(live[s] == payload for s, payload in replayed)
    finally:
        engine.close()


def test_config_refusals() -> None:
    """vLLM's JSON keys only; endpoints that are no ZMQ address; events without prefix caching."""
    from openinfer.engine_core.config import EngineConfig
    from openinfer.engine_core.kv_events_config import offset_endpoint, read_kv_events_config

    with pytest.raises(ValueError, match="unknown field `enable`"):
        read_kv_events_config('{"enable": true}')
    with pytest.raises(ValueError, match="give a ZMQ address"):
        read_kv_events_config('{"enable_kv_cache_events": true, "endpoint": "localhost:5557"}')
    with pytest.raises(ValueError, match="buffer_steps must be >= 1"):
        read_kv_events_config('{"buffer_steps": 0}')
    with pytest.raises(ValueError, match="drop --no-enable-prefix-caching"):
        EngineConfig(Path("m"), "m", enable_prefix_caching=False, kv_events_config=events_config(5557))
    assert not read_kv_events_config('{"enable_kv_cache_events": true, "publisher": "null"}').publishes
    assert read_kv_events_config('{"enable_kv_cache_events": true}').publishes  # zmq, vLLM's default
    # engine i's endpoints: vLLM's data-parallel offset
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
