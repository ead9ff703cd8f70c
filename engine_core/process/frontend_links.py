"""An engine's connections to its frontends: one DEALER + PUSH pair per ``--frontend`` address.

Several frontends can share the engines (``openinfer-serve --api-server-count N``, or frontends started
apart behind a load balancer). Each request's outputs go back to the frontend that sent it; every frontend
gets a message at least every heartbeat interval (its load snapshot: routing and liveness) and its own
hello. The first address is the engine's **metrics frontend**: its hello says ``exports_metrics``, and it
alone exports the engine's counters and gauges, so that summed over frontends each is counted once
(docs/design.md, several frontends).

A frontend that stops reading (it died and nothing restarts it) must not stop the engine for the others:
sends never block. Messages queue for a frontend that is away (a restart, a network blip) up to
:data:`SEND_HWM`; past that the frontend is *stalled*: its requests end with an error, new ones it sends are
refused at once, heartbeats to it are dropped, and the finishes wait (:attr:`FrontendLink.pending`) until
a send to it goes through again, so that every request it still holds ends with a clear error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import zmq

from openinfer.protocol import EngineCoreOutput, FinishReason
from openinfer.protocol.addresses import engine_addresses

logger = logging.getLogger("openinfer.engine")

# Messages queued for one frontend before it counts as stalled: over an hour of idle heartbeats, or tens of
# seconds of a busy engine's steps that the frontend did not read.
SEND_HWM = 10_000
STALLED = (
    "the engine's outputs to this frontend backed up (it stopped reading them), so it ended this request"
)


@dataclass
class FrontendLink:
    """One frontend: requests arrive on ``requests`` (a DEALER), outputs leave by ``outputs`` (a PUSH)."""

    position: int  # in --frontend; 0: the metrics frontend
    address: str  # tcp://HOST:PORT of its ROUTER (its PULL is on PORT+1)
    requests: zmq.Socket
    outputs: zmq.Socket
    last_sent: float = field(default=0.0)  # time.monotonic() of the last message sent here
    stalled: bool = False  # a send found SEND_HWM messages queued; until one goes through again
    pending: list[EngineCoreOutput] = field(default_factory=list)  # finishes not delivered yet (stalled)

    @property
    def exports_metrics(self) -> bool:
        return self.position == 0


class FrontendLinks:
    """Every frontend's sockets, and which frontend each running request came from."""

    def __init__(
        self,
        addresses: tuple[str, ...],
        make_socket: Callable[[int], zmq.Socket],
        identity: bytes,
        send_hwm: int = SEND_HWM,
    ) -> None:
        self.links: list[FrontendLink] = []
        for position, address in enumerate(addresses):
            requests = make_socket(zmq.DEALER)
            requests.setsockopt(zmq.ROUTING_ID, identity)
            requests.setsockopt(zmq.LINGER, 0)
            requests.connect(address)
            outputs = make_socket(zmq.PUSH)
            outputs.setsockopt(zmq.LINGER, 1000)
            outputs.setsockopt(zmq.SNDHWM, send_hwm)
            outputs.connect(engine_addresses(address).outputs)
            self.links.append(FrontendLink(position, address, requests, outputs))
        self._origin: dict[str, FrontendLink] = {}  # request id -> the frontend that sent it
        self.poller = zmq.Poller()
        for link in self.links:
            self.poller.register(link.requests, zmq.POLLIN)

    def readable(self, timeout_ms: int) -> list[FrontendLink]:
        """The links with inputs waiting, after waiting up to ``timeout_ms`` for one."""
        ready = dict(self.poller.poll(timeout_ms))
        return [link for link in self.links if link.requests in ready]

    def frames(self, link: FrontendLink) -> Iterator[bytes]:
        """The frames waiting on ``link``, without blocking."""
        while True:
            try:
                yield link.requests.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return

    def accept(self, request_id: str, link: FrontendLink) -> bool:
        """``link``'s frontend sent this request: its outputs go back there. False when that frontend is
        stalled: the request is refused (its finish is pending), not run."""
        if link.stalled:
            link.pending.append(EngineCoreOutput(request_id, [], FinishReason("error", message=STALLED)))
            return False
        self._origin[request_id] = link
        return True

    def requests_of(self, link: FrontendLink) -> list[str]:
        """The requests ``link``'s frontend sent that have not finished."""
        return [request_id for request_id, origin in self._origin.items() if origin is link]

    def send(self, link: FrontendLink, payload: bytes, outputs: Sequence[EngineCoreOutput]) -> bool:
        """Send a message carrying ``outputs`` to ``link`` without blocking; False when the frontend is
        stalled: then the finishes among ``outputs`` are kept to send later (the caller ends its requests)."""
        try:
            link.outputs.send(payload, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            if not link.stalled:
                logger.warning("the frontend at %s stopped reading; ending its requests", link.address)
                link.stalled = True
            link.pending = [output for output in outputs if output.finish is not None]
            return False
        if link.stalled:
            logger.info("the frontend at %s reads again", link.address)
            link.stalled = False
        link.pending = []
        link.last_sent = time.monotonic()
        return True

    def by_link(
        self, outputs: list[EngineCoreOutput], heartbeat_interval: float
    ) -> list[tuple[FrontendLink, list[EngineCoreOutput]]]:
        """Who gets a message this step: each frontend with outputs (its requests' only) or whose heartbeat
        is due. A request's origin is forgotten with its last output; an output whose origin is unknown (an
        abort of a request already ended here) goes nowhere."""
        mine: dict[int, list[EngineCoreOutput]] = {}
        for output in outputs:
            link = self._origin.get(output.request_id)
            if output.finish is not None:
                self._origin.pop(output.request_id, None)
            if link is not None:
                mine.setdefault(link.position, []).append(output)
        now = time.monotonic()
        return [
            (link, link.pending + mine.get(link.position, []))
            for link in self.links
            if link.position in mine or now - link.last_sent >= heartbeat_interval
        ]
