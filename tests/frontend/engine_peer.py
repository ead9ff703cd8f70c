"""A test peer that speaks the engine's side of the protocol over real ZMQ sockets.

It is not an engine: it answers each request by echoing the prompt's tokens (cyclically), one token per
message, and ends with "length" at max_tokens, or "stop" on an EOS (unless ignore_eos) or a stop token id.
Its spec-decode and prefix-cache counters (``spec``, ``prefix_cache``) are whatever the test makes them;
every message's load carries them. Each request's first output says ``num_cached_tokens`` of its config.
It answers LoadDrafter / UnloadDrafter with a DrafterReply. It exists to test the frontend's side of the
boundary.

A test that needs only a plain engine runs on a real ``--fake-model`` engine process instead (the
``fake_engine`` and ``fake_frontend`` fixtures of conftest.py). The peer stays where a test needs what a
real engine never does or cannot show: forge or withhold messages (stranger and old-version hellos, seqs
out of order, silence while connected, errors and refusals on demand, drafter replies withheld or refused,
cached-token counts and logprobs of its choosing), set its cumulative counters to chosen values, delay each
token, echo the prompt so that every expected text is known token by token, or record what reached the
engine (``requests``, ``aborted``, ``drafter_commands``: "nothing reached the engine" is a property many
tests check).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from openinfer import protocol
from openinfer.frontend.addresses import engine_addresses
from openinfer.protocol.kv_events import KVEventsEndpoint
from tests.frontend import tiny_tokenizer


@dataclass
class PeerConfig:
    """How the peer introduces itself and behaves."""

    engine_index: int = 0
    model_name: str = "tiny"
    max_model_len: int = 64
    heartbeat_s: float = 0.1  # the real engine: at most 1 s
    token_delay_s: float = 0.0  # pause before each output token
    eos_token_ids: list[int] = field(default_factory=lambda: [tiny_tokenizer.EOS_TOKEN_ID])
    vocab_size: int = 300  # the model's (its hello's); above the tiny tokenizer's 300 ids: padding rows
    protocol_version: int = protocol.PROTOCOL_VERSION
    fail_with: str | None = None  # end every request with this error message after its first token
    fail_prefix: str = ""  # with fail_with: only the requests whose id starts with this fail
    # end every request at once, before any token, with this error as the client's fault (bad_request): an
    # engine refusing what a request asks, such as a grammar that does not compile
    refuse_with: str | None = None
    silent_on_request: bool = False  # stop sending anything once a request arrives (a hung engine)
    spec: protocol.SpecDecodeCounters | None = (
        None  # the counters its hello carries (copied; None: no drafter)
    )
    spec_stats: protocol.SpecDecodeCounters | None = None  # put on every request's last output
    prefix_cache: protocol.PrefixCacheCounters | None = None  # what its load carries (copied; None: off)
    num_cached_tokens: int = 0  # put on every request's first output
    tokenizer_config_json: bytes | None = None  # what its hello sends (None: the tiny tokenizer's)
    tokenizer_json: bytes | None = None  # what its hello sends (None: the tiny tokenizer's)
    refuse_drafter: str | None = None  # answer every drafter command not ok, with this message
    ignore_drafter_commands: bool = False  # never answer a drafter command
    exports_metrics: bool = True  # its hello's: False, another frontend is its metrics frontend
    kv_events: KVEventsEndpoint | None = None  # its hello's: where it says it publishes KV events


class EnginePeer:
    """Hello, heartbeats, echoed tokens and aborts, as an asyncio task in the test's loop."""

    def __init__(self, frontend_address: str, config: PeerConfig | None = None) -> None:
        self.addresses = engine_addresses(frontend_address)
        self.config = config or PeerConfig()
        self.incarnation = random.getrandbits(64)
        self.silent = False  # True: send nothing, as a hung engine
        self.requests: dict[str, protocol.EngineCoreRequest] = {}
        self.aborted: list[str] = []
        self.refusals: list[str] = []  # messages of protocol.HelloRefused the frontend sent this peer
        self.hello_requests = 0
        self.spec = None if self.config.spec is None else self.config.spec.copy()
        self.prefix_cache = None if self.config.prefix_cache is None else self.config.prefix_cache.copy()
        self.drafter_commands: list[protocol.LoadDrafter | protocol.UnloadDrafter] = []
        self._seq = 0
        self._in_codec = protocol.EngineInputCodec()
        self._out_codec = protocol.EngineOutputCodec()
        self._context = zmq.asyncio.Context()
        self._dealer: zmq.asyncio.Socket | None = None
        self._push: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        """Connect both sockets and say hello (seq 0)."""
        self._dealer = self._context.socket(zmq.DEALER)
        self._dealer.setsockopt(
            zmq.IDENTITY, protocol.engine_identity(self.config.engine_index, self.incarnation)
        )
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.connect(self.addresses.requests)
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(self.addresses.outputs)
        await self._send_hello()
        self._tasks = [asyncio.create_task(self._receive_loop()), asyncio.create_task(self._heartbeat_loop())]

    @property
    def num_sent(self) -> int:
        """Messages this incarnation sent (its hello and outputs; each takes the next seq)."""
        return self._seq

    async def stop(self) -> None:
        """Stop every task and close the sockets, as if the process died."""
        for task in [*self._tasks, *self._running.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._running.values(), return_exceptions=True)
        self._tasks, self._running = [], {}
        self._context.destroy(linger=0)
        self._context = zmq.asyncio.Context()

    async def restart(self) -> None:
        """Come back as a new incarnation of the same engine index."""
        await self.stop()
        self.incarnation = random.getrandbits(64)
        self._seq = 0
        await self.start()

    async def send_snapshot(self) -> int:
        """Send an outputs message with no outputs (its load carries ``spec`` now); return its seq."""
        seq = self._seq
        await self._send_outputs([])
        return seq

    async def send_raw(self, frames: list[bytes]) -> None:
        """Send arbitrary frames on the output socket (garbage, foreign versions)."""
        assert self._push is not None
        await self._push.send_multipart(frames)

    def hello(self, seq: int) -> protocol.EngineHello:
        c = self.config
        return protocol.EngineHello(
            protocol_version=c.protocol_version,
            engine_index=c.engine_index,
            incarnation=self.incarnation,
            seq=seq,
            model_name=c.model_name,
            max_model_len=c.max_model_len,
            kv_block_size=16,
            kv_num_blocks=64,
            num_spec_tokens=None if self.spec is None else self.spec.num_spec_tokens,
            vocab_size=c.vocab_size,
            eos_token_ids=c.eos_token_ids,
            tokenizer_json=c.tokenizer_json or tiny_tokenizer.tokenizer_json(),
            tokenizer_config_json=c.tokenizer_config_json or tiny_tokenizer.tokenizer_config_json(),
            load=self._load(),
            exports_metrics=c.exports_metrics,
            kv_events=c.kv_events,
        )

    def _load(self) -> protocol.LoadSnapshot:
        return protocol.LoadSnapshot(
            kv_used_blocks=len(self._running), kv_total_blocks=64, num_running_reqs=len(self._running),
            num_waiting_reqs=0, spec_decode=self.spec, prefix_cache=self.prefix_cache,
        )  # fmt: skip

    async def _send_hello(self) -> None:
        assert self._push is not None
        seq, self._seq = self._seq, self._seq + 1
        await self._push.send(self._out_codec.encode(self.hello(seq)))

    async def _send_outputs(self, outputs: list[protocol.EngineCoreOutput]) -> None:
        if self.silent:
            return
        assert self._push is not None
        c = self.config
        seq, self._seq = self._seq, self._seq + 1
        message = protocol.EngineCoreOutputs(
            c.engine_index, self.incarnation, seq, time.time(), outputs, self._load()
        )
        await self._push.send(self._out_codec.encode(message))

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            await self._send_outputs([])

    async def _receive_loop(self) -> None:
        assert self._dealer is not None
        while True:
            message = self._in_codec.decode(await self._dealer.recv())
            if isinstance(message, protocol.EngineCoreRequest):
                self.requests[message.request_id] = message
                if self.config.silent_on_request:
                    self.silent = True
                self._running[message.request_id] = asyncio.create_task(self._generate(message))
            elif isinstance(message, protocol.AbortRequests):
                for request_id in message.request_ids:
                    self.aborted.append(request_id)
                    task = self._running.pop(request_id, None)
                    if task is not None:
                        task.cancel()
            elif isinstance(message, protocol.HelloRequest):
                self.hello_requests += 1
                await self._send_hello()
            elif isinstance(message, protocol.HelloRefused):
                self.refusals.append(message.message)
            elif isinstance(message, protocol.LoadDrafter | protocol.UnloadDrafter):
                self.drafter_commands.append(message)
                if not self.config.ignore_drafter_commands:
                    await self._answer_drafter_command(message)

    async def _answer_drafter_command(self, command: protocol.LoadDrafter | protocol.UnloadDrafter) -> None:
        assert self._push is not None
        ok, message = self.config.refuse_drafter is None, self.config.refuse_drafter or ""
        if ok and isinstance(command, protocol.LoadDrafter):
            if self.spec is None or self.spec.num_spec_tokens != command.num_spec_tokens:
                self.spec = protocol.SpecDecodeCounters.zero(
                    command.num_spec_tokens
                )  # same K: counting goes on
            message = f"loaded the {command.method} drafter with K={command.num_spec_tokens}"
        elif ok:
            self.spec, message = None, "speculative decoding is off"
        seq, self._seq = self._seq, self._seq + 1
        k = None if self.spec is None else self.spec.num_spec_tokens
        reply = protocol.DrafterReply(
            self.config.engine_index, self.incarnation, seq, command.command_id, ok, message, k, self._load()
        )
        await self._push.send(self._out_codec.encode(reply))

    async def _generate(self, request: protocol.EngineCoreRequest) -> None:
        params = request.sampling_params
        prompt = request.prompt_token_ids
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.config.eos_token_ids))
        if self.config.refuse_with is not None:
            refusal = protocol.FinishReason("error", message=self.config.refuse_with, bad_request=True)
            await self._finish(request, [], refusal)
            return
        for i in range(params.max_tokens):
            await asyncio.sleep(self.config.token_delay_s)
            cached = self.config.num_cached_tokens if i == 0 else 0
            failing = request.request_id.startswith(self.config.fail_prefix)
            if self.config.fail_with is not None and failing and i == 1:
                await self._finish(request, [], protocol.FinishReason("error", message=self.config.fail_with))
                return
            token = prompt[i % len(prompt)]
            if token in stops:
                await self._finish(
                    request, [token], protocol.FinishReason("stop", stop_token_id=token), cached
                )
                return
            if i + 1 == params.max_tokens:
                await self._finish(request, [token], protocol.FinishReason("length"), cached)
                return
            logprobs = None if params.logprobs is None else [peer_logprobs(token, params.logprobs)]
            output = protocol.EngineCoreOutput(
                request.request_id, [token], logprobs=logprobs, num_cached_tokens=cached
            )
            await self._send_outputs([output])

    async def _finish(
        self,
        request: protocol.EngineCoreRequest,
        tokens: list[int],
        finish: protocol.FinishReason,
        num_cached_tokens: int = 0,
    ) -> None:
        self._running.pop(request.request_id, None)
        stats = self.config.spec_stats
        k = request.sampling_params.logprobs
        logprobs = None if k is None else [peer_logprobs(token, k) for token in tokens]
        output = protocol.EngineCoreOutput(
            request.request_id,
            tokens,
            finish,
            num_cached_tokens=num_cached_tokens,
            spec_stats=stats,
            logprobs=logprobs,
        )
        await self._send_outputs([output])


def peer_logprobs(token: int, k: int) -> protocol.TokenLogprobs:
    """The peer's made-up logprobs for an echoed token: -0.5 for it, and k alternatives, itself first, then
    the next token ids at -1.5, -2.5, ..."""
    top_ids = [token] + [(token + i) % 300 for i in range(1, k)]
    return protocol.TokenLogprobs(-0.5, top_ids[:k], [-0.5 - i for i in range(k)])
