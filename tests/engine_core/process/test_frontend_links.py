"""An engine's frontends: each request's outputs go back to the frontend that sent it, every frontend gets
its heartbeat, and only the first is told it exports the engine's metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from openinfer.engine_core.process.frontend_links import FrontendLinks
from openinfer.protocol import EngineCoreOutput, FinishReason
from tests.e2e.processes import free_port_pair


@pytest.fixture
def links() -> Iterator[FrontendLinks]:
    context = zmq.Context()
    first = free_port_pair(2)  # nothing listens there: the sockets connect in the background
    addresses = (f"tcp://127.0.0.1:{first}", f"tcp://127.0.0.1:{first + 2}")
    yield FrontendLinks(addresses, context.socket, b"engine-0-0000000000000001")
    context.destroy(linger=0)


def test_outputs_go_to_the_frontend_that_sent_the_request(links: FrontendLinks) -> None:
    """Request a from frontend 0 and b from frontend 1: each frontend's message carries only its own; a
    finished request's origin is forgotten, so a later output of it (an abort's) goes nowhere."""
    zero, one = links.links
    assert (zero.exports_metrics, one.exports_metrics) == (True, False)
    links.accept("a", zero)
    links.accept("b", one)
    now = time.monotonic()
    zero.last_sent = one.last_sent = now  # no heartbeat due
    a, b = EngineCoreOutput("a", [5]), EngineCoreOutput("b", [6], FinishReason("length"))
    assert links.by_link([a, b], heartbeat_interval=60.0) == [(zero, [a]), (one, [b])]
    late = EngineCoreOutput("b", [], FinishReason("abort"))
    assert links.by_link([late], heartbeat_interval=60.0) == []


def test_a_frontend_without_outputs_gets_its_heartbeat_when_due(links: FrontendLinks) -> None:
    """With outputs for frontend 0 only, frontend 1 gets a message (its load) once its interval has passed."""
    zero, one = links.links
    links.accept("a", zero)
    zero.last_sent = time.monotonic()
    one.last_sent = time.monotonic() - 2.0
    a = EngineCoreOutput("a", [5])
    assert links.by_link([a], heartbeat_interval=1.0) == [(zero, [a]), (one, [])]
    one.last_sent = time.monotonic()
    assert links.by_link([a], heartbeat_interval=1.0) == [(zero, [a])]


def test_a_frontend_that_stops_reading_is_stalled_not_waited_for() -> None:
    """Sends never block: past the queue's bound the frontend is stalled (its finishes kept, new requests
    refused with an error finish); once a send goes through it is not stalled and the finishes left."""
    context = zmq.Context()
    try:
        port = free_port_pair()  # nothing listens: every message queues
        links = FrontendLinks((f"tcp://127.0.0.1:{port}",), context.socket, b"engine-0-1", send_hwm=2)
        (link,) = links.links
        links.accept("a", link)
        done = EngineCoreOutput("b", [7], FinishReason("stop"))
        sent = [links.send(link, b"x", [EngineCoreOutput("a", [5]), done]) for _ in range(4)]
        assert sent[0] and not sent[-1] and link.stalled
        assert link.pending == [done] and links.requests_of(link) == ["a"]
        assert not links.accept("c", link)  # refused while stalled: its error finish waits too
        assert [(o.request_id, o.finish.kind) for o in link.pending if o.finish] == [
            ("b", "stop"),
            ("c", "error"),
        ]
        pull = context.socket(zmq.PULL)
        pull.bind(f"tcp://127.0.0.1:{port + 1}")  # the frontend reads again
        # Wait for the fact itself (a send goes through), reading whatever arrives meanwhile: the queue may be
        # read out before the PUSH learns it has room (libzmq tells it by a command its next sends process),
        # so a blocking read per refused send could wait for a message that never comes.
        deadline = time.monotonic() + 30
        while not links.send(link, b"y", link.pending):
            assert time.monotonic() < deadline, "the queue never drained"
            if pull.poll(50):
                pull.recv()
        assert not link.stalled and link.pending == []
    finally:
        context.destroy(linger=0)
