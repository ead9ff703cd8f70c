"""Nothing admitted leaks: every way a request can fail between the router admitting it and its engine
receiving it (a value the wire cannot hold, an engine not connected to the request socket, a client that
leaves meanwhile) takes it out of the router, and its caller learns why. Real sockets throughout."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator

import aiohttp
import pytest
import zmq
import zmq.asyncio

from openinfer import protocol
from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engines.errors import NoEngineError
from openinfer.frontend.engines.request_stream import RequestStream
from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.waits import wait_until

_PATIENCE_S = 2.0  # how long the client retries an unroutable engine (client._SEND_PATIENCE_S)


def make_request(request_id: str, top_k: int | None = None) -> protocol.EngineCoreRequest:
    return protocol.EngineCoreRequest(
        request_id, [50, 60, 70], protocol.SamplingParams(max_tokens=3, top_k=top_k)
    )


@pytest.fixture
async def unreachable(start_frontend: FrontendFactory) -> AsyncIterator[Frontend]:
    """A frontend whose one engine said hello on the output socket but never connected its request socket
    (its DEALER): it is up, and nothing can be sent to it."""
    frontend = await start_frontend(engine_timeout=30.0)
    context = zmq.asyncio.Context()
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(engine_addresses(frontend.engine_address).outputs)
    load = protocol.LoadSnapshot(0, 64, 0, 0, None)
    hello = protocol.EngineHello(
        protocol.PROTOCOL_VERSION, 0, random.getrandbits(64), 0, "tiny", 64, 16, 64, None, 300,
        [tiny_tokenizer.EOS_TOKEN_ID], tiny_tokenizer.tokenizer_json(), tiny_tokenizer.tokenizer_config_json(),
        load,
    )  # fmt: skip
    try:
        await push.send(protocol.EngineOutputCodec().encode(hello))
        await wait_until(lambda: frontend.client.num_engines_up == 1)
        yield frontend
    finally:
        context.destroy(linger=0)


async def test_a_request_the_wire_cannot_hold_is_released(frontend: Frontend, peer: EnginePeer) -> None:
    """An unexpected error after admission (here the encoder's OverflowError on top_k = 2**64, which the
    HTTP layer refuses before admission): raised to the caller, the router holds nothing, the engine got
    nothing, and the next request is served."""
    with pytest.raises(OverflowError):
        await frontend.client.add_request(make_request("r1", top_k=2**64), "tiny")
    assert len(frontend.client.router) == 0 and peer.requests == {}
    stream = await frontend.client.add_request(make_request("r2"), "tiny")
    assert len([output async for output in stream]) == 3
    assert len(frontend.client.router) == 0


async def test_a_request_to_an_unconnected_engine_is_released(unreachable: Frontend) -> None:
    """An engine up but not connected to the request socket: add_request raises NoEngineError saying so
    once its patience is spent, and the router holds nothing."""
    with pytest.raises(NoEngineError, match="not connected to the request socket"):
        await asyncio.wait_for(unreachable.client.add_request(make_request("r1"), "tiny"), _PATIENCE_S + 5)
    assert len(unreachable.client.router) == 0


async def test_http_request_to_an_unconnected_engine_is_503_and_released(unreachable: Frontend) -> None:
    """Over HTTP the same failure is a 503 (no_engine: nothing ran, a retry may work), the router empty."""
    timeout = aiohttp.ClientTimeout(total=_PATIENCE_S + 5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        body = {"prompt": "hello", "max_tokens": 2}
        async with session.post(f"{unreachable.url}/v1/completions", json=body) as response:
            assert response.status == 503
            error = (await response.json())["error"]
    assert error["code"] == "no_engine" and "not connected to the request socket" in error["message"]
    assert len(unreachable.client.router) == 0


async def test_a_caller_that_leaves_while_the_engine_is_unroutable_is_released(unreachable: Frontend) -> None:
    """Cancelled while add_request waits for an unroutable engine (its HTTP client left): the router
    holds nothing, at once."""
    task = asyncio.create_task(unreachable.client.add_request(make_request("r1"), "tiny"))
    await wait_until(lambda: len(unreachable.client.router) == 1)  # admitted, waiting to be sent
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(unreachable.client.router) == 0


async def test_an_http_client_that_leaves_while_the_engine_is_unroutable_is_released(
    unreachable: Frontend, caplog: pytest.LogCaptureFixture
) -> None:
    """Over HTTP: a client that gives up once its request is admitted and waits for the engine leaves nothing
    behind, released by its leaving (not by the send's patience running out, which logs that it could not
    send)."""
    caplog.set_level(logging.WARNING)
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "hello", "max_tokens": 2}
        post = asyncio.create_task(session.post(f"{unreachable.url}/v1/completions", json=body))
        await wait_until(lambda: len(unreachable.client.router) == 1)  # admitted, waiting to be sent
        post.cancel()  # the client leaves: its connection closes
        with pytest.raises(asyncio.CancelledError):
            await post
    await wait_until(lambda: len(unreachable.client.router) == 0)
    assert not [r for r in caplog.records if "could not send" in r.getMessage()]


async def test_a_re_send_that_fails_releases_the_request(
    start_frontend: FrontendFactory,
    start_peer: PeerFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request moved off a dead engine is re-sent by a task of its own; if that send raises (a bug,
    injected here: nothing that runs today raises there), the request ends with an error saying it could
    not be sent, the router holds nothing, and the error is logged rather than left unretrieved."""
    frontend = await start_frontend(engine_timeout=30.0)
    first = await start_peer(frontend, PeerConfig(token_delay_s=60.0))  # holds the request, streams nothing
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    await wait_until(lambda: "r1" in first.requests)
    second = await start_peer(frontend, PeerConfig(engine_index=1))

    async def broken_send(identity: bytes, message: protocol.EngineInput, patience: float = 0.0) -> bool:
        raise RuntimeError("injected")

    monkeypatch.setattr(frontend.client, "_send", broken_send)  # what _deliver sends with
    await first.stop()  # its connection closes: down within about a second, r1 moves to engine 1
    outputs = await asyncio.wait_for(collect(stream), timeout=10)
    finish = outputs[-1].finish
    assert finish is not None and finish.kind == "error"
    assert "then it could not be sent to engine 1" in (finish.message or "")
    assert len(frontend.client.router) == 0 and second.requests == {}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [f"could not re-send request r1 to {second_record(frontend)}"]
    assert errors[0].exc_info is not None and "injected" in str(errors[0].exc_info[1])


async def collect(stream: RequestStream) -> list[protocol.EngineCoreOutput]:
    return [output async for output in stream]


def second_record(frontend: Frontend) -> str:
    record = frontend.client.registry.get(1)
    assert record is not None
    return record.describe()
