"""KV-cache events in vLLM's wire format, for routers that route by cache contents (``--kv-events-config``).

An engine publishes its prefix cache's changes, in the order the cache changes, on a ZMQ PUB socket: each
message is three frames, ``(topic, sequence, payload)``: the topic as given (UTF-8), an 8-byte big-endian
sequence number (0, 1, 2, ... per engine process) and a :class:`KVEventBatch` as MessagePack. The layout is
current vLLM's (``vllm/distributed/kv_events.py``), the one ``vllm-router`` decodes: the batch an array
``[ts, events, data_parallel_rank]``, each event a map whose ``"type"`` names its class (``"BlockStored"``,
...) with every field vLLM declares without a default present (None where openinfer has nothing to say).
Consumers check the keys strictly, so no field of ours is added.

Block hashes are vLLM's default external form: the low 64 bits of the block's SHA-256 key as an unsigned
integer (its last 8 bytes, big-endian). A block's key chains over its parent's, so a hash names its prefix.
"""

from __future__ import annotations

import msgspec

# A block's place in memory, as vLLM names it: openinfer's KV lives on the engine's device.
MEDIUM_GPU = "GPU"


def external_block_hash(key: bytes) -> int:
    """A block key's hash on the wire: the low 64 bits of the SHA-256 digest, as vLLM's int hashes."""
    return int.from_bytes(key[-8:], "big")


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag_field="type", tag=True):
    """One change of an engine's prefix cache."""


class BlockStored(KVCacheEvent):
    """Full blocks of one request became cached: consecutive blocks, each the one before's child."""

    block_hashes: list[int]
    parent_block_hash: int | None  # the block before the first one, None when it starts the prompt
    token_ids: list[int]  # the blocks' tokens: len(block_hashes) * block_size of them
    block_size: int
    # vLLM's required fields after these (no defaults: always on the wire, as vLLM's decoders expect them)
    lora_id: int | None  # None: openinfer serves no LoRA adapters
    medium: str | None  # MEDIUM_GPU
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted (their ids reused): their hashes no longer name anything cached."""

    block_hashes: list[int]
    medium: str | None  # MEDIUM_GPU


class AllBlocksCleared(KVCacheEvent):
    """Every cached block is gone: at an engine's start, and when a failed step makes the cache unknown."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The events of one engine step, oldest first."""

    ts: float  # unix seconds
    events: list[KVEvent]
    data_parallel_rank: int | None = None  # vLLM's field: openinfer sets the engine index


class KVEventsEndpoint(msgspec.Struct, array_like=True, frozen=True):
    """Where an engine publishes its KV events (in its hello), so a frontend can tell routers
    (``/kv_event_sources``). A wildcard host (``*``) means the engine's host."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    hwm: int
    buffer_steps: int
