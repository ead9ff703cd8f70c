"""A consumer of vLLM-format KV events written from vLLM's description alone (vllm/distributed/kv_events.py),
not from openinfer's structs: it reads the frames and MessagePack arrays as raw values, as a router would.

Frames: ``(topic, 8-byte big-endian sequence, payload)``. Payload: ``[ts, events, data_parallel_rank?]``;
each event a map whose ``type`` is its class name, with exactly vLLM's keys: ``{"type": "BlockStored",
"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}``,
``{"type": "BlockRemoved", "block_hashes", "medium"}``, ``{"type": "AllBlocksCleared"}``. Replay (as
vllm-router reads it): send ``(b"", start)`` from a DEALER (the server's ROUTER sees ``(identity, b"",
start)``), read ``(b"", topic, sequence, payload)`` until sequence -1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

STORED_KEYS = {
    "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"
}  # fmt: skip


@dataclass
class Stored:
    hashes: list[int]
    parent: int | None
    token_ids: list[int]
    block_size: int


@dataclass
class Batch:
    sequence: int
    ts: float
    events: list[Any]  # Stored, ("removed", [hashes]) or ("cleared",)
    rank: int | None


def decode_batch(sequence: int, payload: bytes) -> Batch:
    """One payload as raw MessagePack, checked against vLLM's layout."""
    raw = msgspec.msgpack.decode(payload)
    assert isinstance(raw, list) and len(raw) in (2, 3), raw
    ts, events = raw[0], raw[1]
    decoded: list[Any] = []
    for event in events:
        assert isinstance(event, dict), event
        tag = event["type"]
        if tag == "BlockStored":
            assert set(event) == STORED_KEYS, event
            hashes, token_ids, block_size = event["block_hashes"], event["token_ids"], event["block_size"]
            assert event["lora_id"] is None and event["lora_name"] is None and event["medium"] == "GPU", event
            assert hashes and all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
            assert len(token_ids) == len(hashes) * block_size, event
            decoded.append(Stored(hashes, event["parent_block_hash"], token_ids, block_size))
        elif tag == "BlockRemoved":
            assert set(event) == {"type", "block_hashes", "medium"} and event["medium"] == "GPU", event
            decoded.append(("removed", event["block_hashes"]))
        else:
            assert event == {"type": "AllBlocksCleared"}, event
            decoded.append(("cleared",))
    return Batch(sequence, ts, decoded, raw[2] if len(raw) == 3 else None)


@dataclass
class CacheView:
    """The cached block hashes a consumer knows by replaying every event in order, and each block's tokens."""

    hashes: set[int] = field(default_factory=set)
    tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)  # hash -> the block's token ids
    parent: dict[int, int | None] = field(default_factory=dict)

    def apply(self, batch: Batch) -> None:
        for event in batch.events:
            if isinstance(event, Stored):
                parent = event.parent
                for i, block_hash in enumerate(event.hashes):
                    assert block_hash not in self.hashes, "a block stored twice without its removal"
                    size = event.block_size
                    self.hashes.add(block_hash)
                    self.tokens[block_hash] = tuple(event.token_ids[i * size : (i + 1) * size])
                    self.parent[block_hash] = parent
                    parent = block_hash
            elif event[0] == "removed":
                for block_hash in event[1]:
                    assert block_hash in self.hashes, "a block removed that was never stored"
                    self.hashes.discard(block_hash)
            else:
                self.hashes.clear()


class EventReader:
    """A SUB on an engine's events, filling gaps (a late join, a dropped message) from its replay socket."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: bytes = b"") -> None:
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.batches: list[Batch] = []  # every batch in sequence order, from 0 of the current process
        self.payloads: dict[int, bytes] = {}  # each batch's payload, by sequence
        self.view = CacheView()
        self.topic = topic

    def poll(self, timeout: float = 0.0) -> None:
        """Read what has arrived (waiting up to ``timeout`` for the first message)."""
        wait_ms = int(timeout * 1000)
        while self.sub.poll(wait_ms):
            wait_ms = 0
            topic, number, payload = self.sub.recv_multipart()
            assert topic == self.topic
            self._take(int.from_bytes(number, "big"), payload)

    def catch_up(self) -> None:
        """Ask the replay socket for everything after the last batch read (sequence 0 when none)."""
        for sequence, payload in self.replay(self.batches[-1].sequence + 1 if self.batches else 0):
            self._take(sequence, payload)

    def replay(self, start: int, timeout: float = 10.0) -> list[tuple[int, bytes]]:
        dealer = self.context.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            answered: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + timeout
            while True:
                assert dealer.poll(int(max(0.0, deadline - time.monotonic()) * 1000)), "no replay answer"
                empty, topic, number, payload = dealer.recv_multipart()
                assert empty == b"" and topic == self.topic
                sequence = int.from_bytes(number, "big", signed=True)
                if sequence == -1:
                    assert payload == b""
                    return answered
                answered.append((sequence, payload))
        finally:
            dealer.close(linger=0)

    def _take(self, sequence: int, payload: bytes) -> None:
        last = self.batches[-1].sequence if self.batches else -1
        if sequence <= last and payload == self.payloads[sequence]:
            return  # already read (a replay overlapping the live stream)
        if sequence <= last:  # the sequence went back: a new engine process, whose first batch clears
            self.batches.clear()
            self.payloads.clear()
            last = -1
        if sequence > last + 1:  # a gap (a late join, a restart seen late): fetch it first
            for missed, missed_payload in self.replay(last + 1):
                if missed < sequence:
                    self._take(missed, missed_payload)
        assert sequence == (self.batches[-1].sequence + 1 if self.batches else 0), "out of order"
        batch = decode_batch(sequence, payload)
        self.batches.append(batch)
        self.payloads[sequence] = payload
        self.view.apply(batch)

    def close(self) -> None:
        self.context.destroy(linger=0)
