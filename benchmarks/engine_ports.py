"""A local process on a frontend's engine ports, as an attacker uses them: its sockets (every operation
bounded; where the ports authenticate, the refusal is what it reports) and the messages it forges with the
project's own codec."""

from __future__ import annotations

import asyncio
import json
import random
import time

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.protocol import (
    PROTOCOL_VERSION,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineHello,
    EngineInputCodec,
    EngineOutputCodec,
    LoadSnapshot,
    SpecDecodeCounters,
)

SEND_TIMEOUT_S = 1.0  # a ZMQ send not taken within this is given up (a port that does not take us)
HANDSHAKE_TIMEOUT_S = 2.0
_HANDSHAKES = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
_HANDSHAKES |= zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


class EnginePorts:
    """A local process's sockets on the frontend's engine ports: a PUSH to the outputs port (where engines
    send) and, posing as an engine (``identity``), a DEALER on the requests port. Every operation is bounded."""

    def __init__(self, port: int, identity: bytes | None = None) -> None:
        self._context = zmq.asyncio.Context()
        self._push = self._context.socket(zmq.PUSH)
        self._monitor = self._push.get_monitor_socket(_HANDSHAKES)
        self._push.connect(f"tcp://127.0.0.1:{port + 1}")
        self._dealer = self._context.socket(zmq.DEALER)
        if identity is not None:
            self._dealer.setsockopt(zmq.IDENTITY, identity)
            self._dealer.connect(f"tcp://127.0.0.1:{port}")
        self._codec = EngineOutputCodec()

    async def refusal(self) -> str | None:
        """None when the outputs port took our ZMTP handshake; else how it refused."""
        try:
            frames = await asyncio.wait_for(self._monitor.recv_multipart(), HANDSHAKE_TIMEOUT_S)
        except TimeoutError:
            return f"refused: no ZMTP handshake within {HANDSHAKE_TIMEOUT_S:g} s"
        if parse_monitor_message(frames)["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return "refused: the ZMTP handshake failed (the port authenticates)"
        return None

    async def send(self, message: EngineHello | EngineCoreOutputs | list[bytes]) -> bool:
        """Send a message (or raw frames); False when it was not taken within SEND_TIMEOUT_S."""
        frames = message if isinstance(message, list) else [self._codec.encode(message)]
        try:
            await asyncio.wait_for(self._push.send_multipart(frames), SEND_TIMEOUT_S)
        except TimeoutError:
            return False
        return True

    async def requests_received(self, seconds: float) -> int:
        """How many requests the frontend sent us within ``seconds``."""
        received, deadline, codec = 0, time.monotonic() + seconds, EngineInputCodec()
        while (left := deadline - time.monotonic()) > 0:
            try:
                frame = await asyncio.wait_for(self._dealer.recv(), left)
            except TimeoutError:
                break
            received += isinstance(codec.decode(frame), EngineCoreRequest)
        return received

    def close(self) -> None:
        self._context.destroy(linger=0)


def idle_load(counters: SpecDecodeCounters | None) -> LoadSnapshot:
    """An idle engine's load: 1024 free KV blocks, no requests, these spec-decode counters."""
    return LoadSnapshot(kv_used_blocks=0, kv_total_blocks=1024, num_running_reqs=0, num_waiting_reqs=0,
                        spec_decode=counters)  # fmt: skip


def outputs(index: int, incarnation: int, seq: int, new: list[EngineCoreOutput],
            counters: SpecDecodeCounters | None = None) -> EngineCoreOutputs:  # fmt: skip
    """An engine's outputs message (a heartbeat when ``new`` is empty)."""
    return EngineCoreOutputs(engine_index=index, incarnation=incarnation, seq=seq, timestamp=time.time(),
                             outputs=new, load=idle_load(counters))  # fmt: skip


def hello(model: str, index: int, max_model_len: int = 2048) -> EngineHello:
    """A new incarnation's hello for ``model``, with the built-in model's tokenizer files; K = 7."""
    folder = builtin_target_folder()
    return EngineHello(
        protocol_version=PROTOCOL_VERSION, engine_index=index, incarnation=random.getrandbits(64), seq=0,
        model_name=model, max_model_len=max_model_len, kv_block_size=16, kv_num_blocks=1024, num_spec_tokens=7,
        vocab_size=json.loads((folder / "config.json").read_text())["vocab_size"], eos_token_ids=[0],
        tokenizer_json=(folder / "tokenizer.json").read_bytes(),
        tokenizer_config_json=(folder / "tokenizer_config.json").read_bytes(),
        load=idle_load(SpecDecodeCounters.zero(7)),
    )  # fmt: skip


# ---- the attacks, in the order of issue 25's list ----
