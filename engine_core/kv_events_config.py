"""``--kv-events-config``: vLLM's JSON for publishing the prefix cache's changes as KV events (no torch, no zmq).

The keys and defaults are vLLM's (``KVEventsConfig``), so a vLLM command line carries over unchanged. An
engine binds its endpoints with their port offset by its engine index, as vLLM offsets them by the
data-parallel rank: under ``openinfer-serve --engines 2`` and ``"endpoint": "tcp://*:5557"``, engine 0
publishes on port 5557 and engine 1 on 5558 (and the replay endpoint likewise).
"""

from __future__ import annotations

from typing import Literal

import msgspec

_SCHEMES = ("tcp://", "ipc://", "inproc://")


class KVEventsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """vLLM's KV-events keys; an unknown key is refused, naming the ones there are."""

    enable_kv_cache_events: bool = False  # False: nothing is published
    publisher: Literal["null", "zmq"] | None = None  # None: zmq when enabled (vLLM's default)
    endpoint: str = "tcp://*:5557"  # the PUB socket: bound where it holds '*' (or ipc/inproc), else connected
    replay_endpoint: str | None = None  # a ROUTER bound here serves missed batches; None: no replay
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark (messages)
    max_queue_size: int = 100_000  # batches waiting for the publisher thread before the engine waits
    topic: str = ""  # each message's first frame

    def __post_init__(self) -> None:
        for name, endpoint in (("endpoint", self.endpoint), ("replay_endpoint", self.replay_endpoint)):
            bad_port = endpoint is not None and endpoint.startswith("tcp://") and not _port(endpoint)
            if endpoint is not None and (not endpoint.startswith(_SCHEMES) or bad_port):
                raise ValueError(f"{name} {endpoint!r}: give a ZMQ address such as tcp://*:5557")
        for name, value in (("buffer_steps", self.buffer_steps), ("max_queue_size", self.max_queue_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.hwm < 0:
            raise ValueError(f"hwm must be >= 0, got {self.hwm}")

    @property
    def publishes(self) -> bool:
        """Whether an engine publishes events: enabled, with the zmq publisher (vLLM's "null" publishes none)."""
        return self.enable_kv_cache_events and self.publisher != "null"


def read_kv_events_config(text: str) -> KVEventsConfig:
    """``--kv-events-config``'s JSON object; ValueError saying what is wrong with it."""
    try:
        return msgspec.json.decode(text, type=KVEventsConfig)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        keys = ", ".join(KVEventsConfig.__struct_fields__)
        raise ValueError(f"--kv-events-config: {e} (vLLM's JSON object of {keys})") from None


def _port(endpoint: str) -> bool:
    """Whether a tcp:// endpoint ends in a port number."""
    return endpoint.rpartition(":")[2].isdigit()


def offset_endpoint(endpoint: str, offset: int) -> str:
    """``endpoint`` for the engine ``offset`` places after the first: a TCP port moved up by ``offset``, an
    ipc/inproc name suffixed ``_dp{offset}`` (vLLM's rule for data-parallel ranks)."""
    if offset == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return f"{host}:{int(port) + offset}"
    return f"{endpoint}_dp{offset}"
