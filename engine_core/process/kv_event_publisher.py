"""An engine's KV events on ZMQ, as vLLM publishes them: a PUB socket and a replay ROUTER, in a thread.

Each batch leaves as three frames ``(topic, sequence, payload)`` (protocol/kv_events.py), the sequence
counting 0, 1, 2, ... for the engine process; the first batch is ``AllBlocksCleared``, so a subscriber that
knew an earlier process of the same engine drops what it held. The last ``buffer_steps`` batches are kept:
a request on the replay socket, ``(identity, b"", start)`` with ``start`` an 8-byte big-endian sequence
number, is answered with every kept batch from ``start`` on, ``(identity, b"", topic, sequence, payload)``
each, then ``(identity, b"", topic, -1 as 8 signed bytes, b"")``: the frames of the live stream behind the
envelope, as vllm-router reads them (and TensorRT-LLM sends them; vLLM's own publisher leaves out the
topic). The engine's loop only encodes and queues; the thread owns both sockets after they are bound.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import msgspec
import zmq

from openinfer.engine_core.kv_events_config import KVEventsConfig, offset_endpoint
from openinfer.protocol.kv_events import KVEvent, KVEventBatch, KVEventsEndpoint

logger = logging.getLogger("openinfer.engine")

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
_POLL_S = 0.05  # the thread's longest wait for a batch before it looks at the replay socket again


class KVEventPublisher:
    """Publishes one engine's KV-event batches; :meth:`close` sends what is queued, then stops."""

    def __init__(self, config: KVEventsConfig, engine_index: int, context: zmq.Context) -> None:
        self.endpoint = offset_endpoint(config.endpoint, engine_index)
        self.replay_endpoint = (
            offset_endpoint(config.replay_endpoint, engine_index) if config.replay_endpoint else None
        )
        self.engine_index = engine_index
        self.source = KVEventsEndpoint(
            self.endpoint, self.replay_endpoint, config.topic, config.hwm, config.buffer_steps
        )
        self._topic = config.topic.encode()
        self._encoder = msgspec.msgpack.Encoder()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=config.max_queue_size)
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._pub = context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay = context.socket(zmq.ROUTER) if self.replay_endpoint else None
        try:
            _bind_or_connect(self._pub, self.endpoint)
            if self._replay is not None and self.replay_endpoint is not None:
                self._replay.bind(self.replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise ValueError(
                f"--kv-events-config: cannot open {self.endpoint} / {self.replay_endpoint} for engine "
                f"{engine_index} ({e}); engine i takes each endpoint's port + i"
            ) from None
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        logger.info(
            "publishing KV events on %s%s",
            self.endpoint,
            f", replay on {self.replay_endpoint}" if self.replay_endpoint else "",
        )

    def publish(self, events: list[KVEvent]) -> None:
        """Queue one step's events as a batch (none: nothing); waits while ``max_queue_size`` are queued."""
        if events:
            batch = KVEventBatch(time.time(), events, self.engine_index)
            self._queue.put(self._encoder.encode(batch))

    def close(self, timeout: float = 2.0) -> None:
        """Send the queued batches (for at most ``timeout`` seconds), then close both sockets."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("KV events still queued after %.0f s were dropped at exit", timeout)
        else:
            self._close_sockets()

    def _run(self) -> None:
        sequence = 0
        while True:
            self._serve_replays()
            try:
                payload = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if payload is None:
                return
            number = sequence.to_bytes(8, "big")
            self._pub.send_multipart((self._topic, number, payload))
            self._kept.append((sequence, payload))
            sequence += 1

    def _serve_replays(self) -> None:
        """Answer every waiting replay request; a malformed one is logged and dropped."""
        replay = self._replay
        while replay is not None and replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3 or frames[1] or len(frames[2]) != 8:
                logger.warning("dropped a malformed KV-event replay request (%d frames)", len(frames))
                continue
            identity, _, start = frames
            first = int.from_bytes(start, "big")
            for sequence, payload in list(self._kept):
                if sequence >= first:
                    replay.send_multipart((identity, b"", self._topic, sequence.to_bytes(8, "big"), payload))
            replay.send_multipart((identity, b"", self._topic, END_OF_REPLAY, b""))

    def _close_sockets(self) -> None:
        self._pub.close(linger=1000)  # what is sent reaches subscribers still connected
        if self._replay is not None:
            self._replay.close(linger=0)


_LOOPBACK = ("tcp://127.", "tcp://localhost:", "tcp://[::1]:")


def _bind_or_connect(socket: zmq.Socket, endpoint: str) -> None:
    """vLLM's rule: bind a wildcard (``*``, ``::``), ipc or inproc endpoint, connect to any other; and bind a
    loopback address too (subscribers on the same host connect to it; vLLM would connect to it)."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://", *_LOOPBACK)):
        socket.bind(endpoint)
    else:
        socket.connect(endpoint)
