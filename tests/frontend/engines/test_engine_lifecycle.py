"""Engine lifecycle through real ZMQ sockets: death seen on the connection, requests moved or ended, paused
engines taken back, strays aborted, frames from unknown peers counted, bounds on queued requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import zmq
import zmq.asyncio

from openinfer.frontend.engines.errors import EngineOverloadedError
from openinfer.protocol import (
    AbortRequests,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineInputCodec,
    EngineOutputCodec,
    SpecDecodeCounters,
)
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.engines.engine_requests import make_request
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.metrics.scrape import sync
from tests.frontend.waits import wait_until


async def collect(stream: AsyncIterator[EngineCoreOutput]) -> list[EngineCoreOutput]:
    return [output async for output in stream]


def sample(frontend: Frontend, name: str, **labels: str) -> float:
    return frontend.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_killed_engine_is_down_in_about_a_second(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Its output connection closes: down (engine_up 0) and its streamed request fails on the close's probe
    (not heard from in the 1 s after it), not the 30 s silence timeout, with a message naming it and the
    closed connection."""
    frontend = await start_frontend(engine_timeout=30.0)
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    stream = await frontend.client.add_request(make_request("r1", max_tokens=500), "tiny")
    await anext(stream)
    await peer.stop()  # its sockets close, as when the process is killed
    # A bounded wait, well inside the silence timeout; which rule ended the stream is in its message.
    outputs = await asyncio.wait_for(collect(stream), timeout=10.0)
    finish = outputs[-1].finish
    assert finish is not None and finish.kind == "error"
    assert "engine 0" in (finish.message or "") and "connection closed" in (finish.message or "")
    assert "not heard from in 1 s" in (finish.message or "") and "sent nothing" not in (finish.message or "")
    assert sample(frontend, "openinfer:engine_up", engine="0") == 0


async def test_request_without_output_moves_to_another_engine(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """A request its dying engine never answered is re-sent to another live engine: the client sees a
    normal completion."""
    frontend = await start_frontend(engine_timeout=30.0)
    stuck = await start_peer(frontend, PeerConfig(engine_index=0, token_delay_s=60.0))
    other = await start_peer(frontend, PeerConfig(engine_index=1))
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    assert stream.engine_index == 0  # the lowest index on a tie
    await wait_until(lambda: "r1" in stuck.requests)
    await stuck.stop()
    outputs = [output async for output in stream]
    assert [o.new_token_ids for o in outputs] == [[50], [60], [70]]
    assert outputs[-1].finish is not None and outputs[-1].finish.kind == "length"
    assert stream.engine_index == 1 and "r1" in other.requests


async def test_paused_engine_comes_back_with_its_baseline(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Silent past the timeout (SIGSTOP): down, requests ended and aborted on it; heard again with the same
    incarnation: up, no restart, and its counters go on from the baseline (nothing lost or doubled)."""
    frontend = await start_frontend(engine_timeout=0.3)
    spec = SpecDecodeCounters.zero(2)
    spec.observe_draft(2, 1)
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05, spec=spec))
    stream = await frontend.client.add_request(make_request("r1", max_tokens=500), "tiny")
    await anext(stream)
    peer.silent = True
    assert peer.spec is not None
    peer.spec.observe_draft(2, 2)  # drafted while "paused": sent when it resumes
    outputs = [output async for output in stream]
    assert outputs[-1].finish is not None and outputs[-1].finish.kind == "error"
    await wait_until(lambda: "r1" in peer.aborted)  # queued for it while paused
    peer.silent = False
    await wait_until(lambda: frontend.client.num_engines_up == 1)
    await peer.send_snapshot()
    await wait_until(
        lambda: sample(frontend, "vllm:spec_decode_num_drafts_total", model_name="tiny", engine="0") == 1
    )
    assert sample(frontend, "vllm:spec_decode_num_accepted_tokens_total", model_name="tiny", engine="0") == 2
    assert sample(frontend, "openinfer:engine_restarts_total", engine="0") == 0
    assert sample(frontend, "openinfer:spec_decode_counter_resets_total", engine="0", reason="restart") == 0


async def test_outputs_for_ended_requests_are_aborted_once(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """An engine sending outputs for a request that is not in flight here is told to abort it, once."""
    peer = await start_peer(frontend)
    await peer._send_outputs([EngineCoreOutput("ghost", [5])])
    await peer._send_outputs([EngineCoreOutput("ghost", [6])])
    await sync(frontend, peer)  # the frontend has read both outputs (one connection, in order): aborts sent
    stream = await frontend.client.add_request(make_request("after"), "tiny")
    # A request sent after those aborts, on the same pipe: once the peer has it, it has every abort before it.
    await wait_until(lambda: "after" in peer.requests)
    assert peer.aborted == ["ghost"]
    assert len([output async for output in stream]) == 3


async def test_frames_on_the_request_socket_are_counted_and_dropped(frontend: Frontend, peer: object) -> None:
    """Engines never send on the ROUTER: a stranger's frames there are counted as "unexpected"."""
    context = zmq.asyncio.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(frontend.engine_address)
        for _ in range(3):
            await dealer.send(b"\x93\xa3req\x01\x02")
        await wait_until(lambda: sample(frontend, "openinfer:protocol_errors_total", kind="unexpected") == 3)
    finally:
        context.destroy(linger=0)
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    assert len([output async for output in stream]) == 3


async def test_queued_request_bounds(start_frontend: FrontendFactory, start_peer: PeerFactory) -> None:
    """Past the per-engine bound (and then the total), add_request refuses at once; a finished request
    frees its place."""
    frontend = await start_frontend(max_queued_per_engine=2, max_queued_total=3)
    await start_peer(frontend, PeerConfig(engine_index=0, token_delay_s=0.05))
    held = [
        await frontend.client.add_request(make_request(f"a{i}", max_tokens=100), "tiny") for i in range(2)
    ]
    try:
        await frontend.client.add_request(make_request("a2"), "tiny")
        raise AssertionError("the per-engine bound was not applied")
    except EngineOverloadedError as e:
        assert "--max-queued-per-engine" in str(e)
    await start_peer(frontend, PeerConfig(engine_index=1, token_delay_s=0.05))
    held.append(await frontend.client.add_request(make_request("b0", max_tokens=100), "tiny"))
    try:
        await frontend.client.add_request(make_request("b1"), "tiny")
        raise AssertionError("the total bound was not applied")
    except EngineOverloadedError as e:
        assert "--max-queued-total" in str(e)
    await frontend.client.abort("a0")
    stream = await frontend.client.add_request(make_request("c0"), "tiny")
    assert len([output async for output in stream]) == 3


async def test_overloaded_is_503_with_retry_after(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Over HTTP the refusal is an OpenAI error body with status 503 and a Retry-After header."""
    frontend = await start_frontend(max_queued_per_engine=1, max_queued_total=1)
    await start_peer(frontend, PeerConfig(token_delay_s=0.2))
    body = {"model": "tiny", "prompt": [50, 60], "max_tokens": 5}
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(session.post(f"{frontend.url}/v1/completions", json=body))
        await wait_until(lambda: frontend.client.num_queued == 1)
        async with session.post(f"{frontend.url}/v1/completions", json=body) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            error = (await r.json())["error"]
            assert error["code"] == "overloaded" and "retry later" in error["message"]
        async with await first as r:
            assert r.status == 200


async def test_each_kind_of_bad_frame_is_counted(frontend: Frontend, peer: EnginePeer) -> None:
    """Truncated, wrong-direction and replayed (seq going back) frames: each counted by kind and dropped;
    the engine's counters and requests are untouched."""
    codec = EngineOutputCodec()
    valid = codec.encode(EngineCoreOutputs(0, peer.incarnation, 10**6, 0.0, [], peer._load()))
    await peer.send_raw([valid[:-3]])  # truncated
    await peer.send_raw([EngineInputCodec().encode(AbortRequests(["x"]))])  # a frontend->engine message
    seq = await peer.send_snapshot()
    replay = codec.encode(
        EngineCoreOutputs(0, peer.incarnation, seq, 0.0, [EngineCoreOutput("r", [1])], peer._load())
    )
    await peer.send_raw([replay])  # the same seq again
    await wait_until(lambda: sample(frontend, "openinfer:protocol_errors_total", kind="undecodable") == 1)
    await wait_until(lambda: sample(frontend, "openinfer:protocol_errors_total", kind="invalid") == 1)
    await wait_until(lambda: sample(frontend, "openinfer:protocol_errors_total", kind="seq") == 1)
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    assert len([output async for output in stream]) == 3


async def test_a_dead_receive_loop_is_reported_not_hidden(start_frontend: FrontendFactory) -> None:
    """When the outputs socket goes away under the receive loop, crashed() names the loop and what ended it
    (the frontend then exits, for openinfer-serve to restart it), rather than the frontend going on deaf."""
    frontend = await start_frontend()
    sockets = frontend.client._sockets
    assert sockets is not None
    crashed = asyncio.create_task(frontend.client.crashed())
    await asyncio.sleep(0)
    assert not crashed.done()  # running and healthy: nothing to report
    sockets.pull.close(linger=0)  # pyzmq cancels the loop's pending receive
    why = await asyncio.wait_for(crashed, 5)
    assert why == "engine-client-receive was cancelled"
