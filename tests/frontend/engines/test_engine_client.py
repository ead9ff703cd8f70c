"""EngineClient over real ZMQ sockets: handshake, bad frames, routing, liveness, restarts, aborts."""

from __future__ import annotations

import msgspec
import pytest

from openinfer.engine_core.launch.local_cluster import free_port_pair
from openinfer.engine_core.worker.fake_model_runner import FIRST_CYCLE_TOKEN
from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engines.client import EngineClient
from openinfer.frontend.engines.errors import NoEngineError
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, SamplingParams
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.engines.engine_requests import make_request
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.waits import wait_until


def protocol_errors(frontend: Frontend, kind: str) -> float:
    value = frontend.metrics.registry.get_sample_value("openinfer:protocol_errors_total", {"kind": kind})
    return value or 0.0


def test_engine_addresses_use_port_and_port_plus_one() -> None:
    """tcp://HOST:PORT means requests on PORT and outputs on PORT+1; anything else is refused clearly."""
    assert engine_addresses("tcp://0.0.0.0:5555") == ("tcp://0.0.0.0:5555", "tcp://0.0.0.0:5556")
    for bad in ["0.0.0.0:5555", "ipc:///tmp/x", "tcp://host", "tcp://host:65535"]:
        with pytest.raises(ValueError, match="tcp://HOST:PORT|PORT must"):
            engine_addresses(bad)


async def test_outputs_stream_in_order_and_end_with_finish(fake_frontend: Frontend) -> None:
    """add_request yields a real engine's outputs one by one (the fake model's greedy cycle); the last
    carries finish "length"; nothing stays in flight."""
    frontend = fake_frontend
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    stream = await frontend.client.add_request(EngineCoreRequest("r1", [50, 60, 70], greedy), "fake")
    outputs = [output async for output in stream]
    # 70 is outside the cycle: the cycle's first token follows it, then the next ones
    assert [o.new_token_ids for o in outputs] == [[FIRST_CYCLE_TOKEN + i] for i in range(3)]
    assert outputs[-1].finish is not None and outputs[-1].finish.kind == "length"
    assert frontend.client.router.on_engine(frontend.client.registry.get(0)) == {}  # type: ignore[arg-type]


async def test_garbage_frames_are_counted_and_dropped(frontend: Frontend, peer: EnginePeer) -> None:
    """Undecodable, multi-frame and impossible messages are counted by kind; the engine keeps working."""
    await peer.send_raw([b"\xc1garbage"])
    await peer.send_raw([b"one", b"two"])
    await peer.send_raw([msgspec.msgpack.encode(["out", 0, 1])])  # an outputs message missing fields
    await wait_until(
        lambda: protocol_errors(frontend, "undecodable") + protocol_errors(frontend, "invalid") == 2
    )
    await wait_until(lambda: protocol_errors(frontend, "frames") == 1)
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    assert len([output async for output in stream]) == 3


async def test_foreign_protocol_version_is_refused(
    frontend: Frontend, start_peer: PeerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A hello of another protocol version is refused, logged, counted as kind "version", and the engine is
    told why (a HelloRefused naming both versions, for its own log)."""
    refused = await start_peer(frontend, PeerConfig(protocol_version=99), wait=False)
    await wait_until(lambda: protocol_errors(frontend, "version") == 1)
    assert frontend.client.num_engines_up == 0
    assert "protocol version 99" in caplog.text
    await wait_until(lambda: len(refused.refusals) == 1)
    assert "protocol version 99" in refused.refusals[0]
    undecodable_hello = msgspec.msgpack.encode(["hello", 98, "a", "shape", "we", "do", "not", "know"])
    peer = await start_peer(frontend, PeerConfig(engine_index=1))
    await peer.send_raw([undecodable_hello])
    await wait_until(lambda: protocol_errors(frontend, "version") == 2)


async def test_least_loaded_engine_gets_the_request(frontend: Frontend, start_peer: PeerFactory) -> None:
    """With two idle engines, four requests alternate 0, 1, 0, 1 (load includes requests just sent)."""
    slow = PeerConfig(token_delay_s=0.5)
    peers = [
        await start_peer(frontend, PeerConfig(engine_index=i, token_delay_s=slow.token_delay_s))
        for i in (0, 1)
    ]
    streams = [
        await frontend.client.add_request(make_request(f"r{i}", max_tokens=50), "tiny") for i in range(4)
    ]
    assert [s.engine_index for s in streams] == [0, 1, 0, 1]
    await wait_until(
        lambda: sorted(peers[0].requests) == ["r0", "r2"] and sorted(peers[1].requests) == ["r1", "r3"]
    )


async def test_requests_go_only_to_engines_serving_the_model(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """Each model's requests reach its engine; an unserved model raises NoEngineError."""
    await start_peer(frontend, PeerConfig(engine_index=0, model_name="a"))
    await start_peer(frontend, PeerConfig(engine_index=1, model_name="b"))
    assert [m.name for m in frontend.client.served_models()] == ["a", "b"]
    assert (await frontend.client.add_request(make_request("r1"), "b")).engine_index == 1
    with pytest.raises(NoEngineError):
        await frontend.client.add_request(make_request("r2"), "c")


async def test_abort_reaches_the_engine(frontend: Frontend, start_peer: PeerFactory) -> None:
    """abort() sends AbortRequests to the request's engine and ends the stream with "abort"."""
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    stream = await frontend.client.add_request(make_request("r1", max_tokens=50), "tiny")
    await anext(stream)
    await frontend.client.abort("r1")
    await wait_until(lambda: peer.aborted == ["r1"])
    outputs = [output async for output in stream]
    assert outputs[-1].finish is not None and outputs[-1].finish.kind == "abort"


async def test_outputs_for_unknown_requests_are_dropped(frontend: Frontend, peer: EnginePeer) -> None:
    """An output for a request id the frontend does not know is dropped without error."""
    await peer._send_outputs([EngineCoreOutput("nobody", [5])])
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    assert len([output async for output in stream]) == 3
    assert protocol_errors(frontend, "invalid") == 0


async def test_silent_engine_is_marked_down_and_comes_back(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Past the timeout: down, engine_up 0, in-flight ends with an error naming it; heard again: up."""
    frontend = await start_frontend(engine_timeout=0.3)
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    stream = await frontend.client.add_request(make_request("r1", max_tokens=50), "tiny")
    peer.silent = True
    outputs = [output async for output in stream]
    finish = outputs[-1].finish
    assert finish is not None and finish.kind == "error" and "engine 0" in (finish.message or "")
    assert frontend.metrics.registry.get_sample_value("openinfer:engine_up", {"engine": "0"}) == 0
    await wait_until(lambda: "r1" in peer.aborted)  # told to stop, in case it comes back
    peer.silent = False
    await wait_until(lambda: frontend.client.num_engines_up == 1)
    assert frontend.metrics.registry.get_sample_value("openinfer:engine_up", {"engine": "0"}) == 1


async def test_new_incarnation_ends_the_old_ones_requests(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """A restarted engine (new incarnation, same index) fails the old requests that streamed something
    and is counted."""
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    stream = await frontend.client.add_request(make_request("r1", max_tokens=50), "tiny")
    await anext(stream)  # a token reached the client: the request cannot move
    await peer.restart()
    outputs = [output async for output in stream]
    finish = outputs[-1].finish
    assert finish is not None and finish.kind == "error" and "restarted" in (finish.message or "")
    await wait_until(lambda: frontend.client.registry.current(0, peer.incarnation) is not None)
    restarts = frontend.metrics.registry.get_sample_value("openinfer:engine_restarts_total", {"engine": "0"})
    assert restarts == 1
    stream = await frontend.client.add_request(make_request("r2"), "tiny")
    assert len([output async for output in stream]) == 3


async def test_restarted_frontend_asks_running_engines_for_their_hello() -> None:
    """A frontend that missed an engine's hello sends it a HelloRequest and then serves through it."""
    address = f"tcp://127.0.0.1:{free_port_pair()}"
    first = EngineClient(address, FrontendMetrics())
    await first.start()
    peer = EnginePeer(address)
    await peer.start()
    second = EngineClient(address, FrontendMetrics())
    try:
        await wait_until(lambda: first.num_engines_up == 1)  # the hello went to the first frontend
        await first.close()
        await second.start()
        await wait_until(lambda: second.num_engines_up == 1)
        assert peer.hello_requests >= 1
        stream = await second.add_request(make_request("r1"), "tiny")
        assert len([output async for output in stream]) == 3
    finally:
        await second.close()
        await peer.stop()
