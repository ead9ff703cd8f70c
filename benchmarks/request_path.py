"""Which files one streamed chat request with DFlash crosses, frontend and engine; not a test.

    python -m openinfer.benchmarks.request_path [--max-tokens 8] [--top 8]

Runs the frontend (its aiohttp app, in this process's main thread) and one engine serving the built-in target
with its DFlash drafter (the engine's socket loop, in a thread of this process), each built as its command
builds it and talking over loopback ZeroMQ as always. One untraced request warms both up; then a profile hook
on every thread follows one streamed chat completion from the moment it is sent to its last chunk.

What counts: code of openinfer's packages (``protocol``, ``engine_core``, ``kernels``, ``frontend``), not
aiohttp, torch or this script. A *step* is the running file changing from one project file to another, at a
call or at a return; a *revisit* is a step into a file the process has already been in during the request.
Calls made inside ``engine_core/models/`` and ``kernels/`` fold into the call that entered them: a model
forward is one visit, not one per layer. The counts are of the code's shape, not of its speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp

from openinfer import engine_core, frontend, kernels, protocol
from openinfer.engine_core.launch.local_cluster import free_ports

ROOTS = {
    Path(next(iter(package.__path__))): package.__name__
    for package in (protocol, engine_core, kernels, frontend)
}
FOLDED = ("openinfer.engine_core/models/", "openinfer.kernels/")
ENGINE_THREAD = "engine-loop"


def project_name(filename: str) -> str | None:
    """``openinfer.engine_core/core/engine_core.py`` for a file of the project's packages, else None."""
    path = Path(filename)
    for root, package in ROOTS.items():
        if path.is_relative_to(root):
            return f"{package}/{path.relative_to(root).as_posix()}"
    return None


@dataclass
class ProcessPath:
    """The files one process (a group of threads) ran through, in order."""

    steps: int = 0
    revisits: int = 0
    entries: Counter[str] = field(default_factory=Counter)
    edges: Counter[tuple[str, str]] = field(default_factory=Counter)  # (from, to) per step

    def enter(self, previous: str | None, name: str) -> None:
        """The running file became ``name`` (from ``previous``, None: from code outside the project)."""
        if previous is not None:
            self.steps += 1
            self.edges[previous, name] += 1
            if name in self.entries:
                self.revisits += 1
        self.entries[name] += 1


@dataclass
class ThreadStack:
    """A thread's project frames, innermost last: (frame, its file's project name)."""

    frames: list[tuple[FrameType, str]] = field(default_factory=list)

    @property
    def current(self) -> str | None:
        return self.frames[-1][1] if self.frames else None


class PathTracer:
    """A profile hook (``sys.setprofile`` on every thread) counting steps between project files per process
    while ``enabled``."""

    def __init__(self) -> None:
        self.enabled = False
        self.paths = {"frontend": ProcessPath(), "engine": ProcessPath()}
        self._stacks: dict[int, ThreadStack] = {}

    def start(self) -> None:
        """Begin counting, each thread's stack seeded with the project frames it is already in."""
        for ident, frame in sys._current_frames().items():
            stack = self._stacks[ident] = ThreadStack()
            chain: list[FrameType] = []
            walk: FrameType | None = frame
            while walk is not None:
                chain.append(walk)
                walk = walk.f_back
            for outer in reversed(chain):
                name = project_name(outer.f_code.co_filename)
                if name is not None and not (stack.current or "").startswith(FOLDED):
                    stack.frames.append((outer, name))
        self.enabled = True

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.enabled or event not in ("call", "return"):
            return
        thread = threading.current_thread()
        stack = self._stacks.setdefault(thread.ident or 0, ThreadStack())
        path = self.paths["engine" if thread.name == ENGINE_THREAD else "frontend"]
        previous = stack.current
        if event == "call":
            name = project_name(frame.f_code.co_filename)
            if name is None or (previous or "").startswith(FOLDED):
                return
            stack.frames.append((frame, name))
        elif stack.frames and stack.frames[-1][0] is frame:
            stack.frames.pop()
        else:
            return
        current = stack.current
        if current is not None and current != previous:
            path.enter(previous, current)


async def served_model(url: str) -> str:
    """The model the frontend serves, once an engine's hello has come."""
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/models") as reply:
                models = (await reply.json())["data"] if reply.status == 200 else []
                if models:
                    return str(models[0]["id"])
        await asyncio.sleep(0.1)


async def stream_one(url: str, model: str, max_tokens: int) -> int:
    """One streamed chat completion; the chunks it took."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "The king said to his son that the"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    chunks = 0
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=body) as reply,
    ):
        reply.raise_for_status()
        async for line in reply.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                json.loads(line[6:])
                chunks += 1
    return chunks


@contextlib.contextmanager
def engine_thread(engine_port: int) -> Iterator[None]:
    """The built-in model with DFlash (K=4) in one engine's socket loop, on a thread of this process."""
    from openinfer.engine_core.core.engine_core import EngineCore
    from openinfer.engine_core.process.engine_args import config_from_args
    from openinfer.engine_core.process.engine_cli import load_runner, parse_args
    from openinfer.engine_core.process.engine_process import EngineProcess

    argv = [
        "--frontend",
        f"tcp://127.0.0.1:{engine_port}",
        "--spec-method",
        "dflash",
        "--num-spec-tokens",
        "4",
    ]
    config = config_from_args(parse_args(argv))
    process = EngineProcess(config, EngineCore(config, load_runner(config)))
    thread = threading.Thread(target=process.run, name=ENGINE_THREAD, daemon=True)
    thread.start()
    try:
        yield
    finally:
        process.stop()
        thread.join(timeout=10)


async def trace_request(max_tokens: int) -> PathTracer:
    """Serve, warm up, then trace one streamed request."""
    from openinfer.frontend.process import main as frontend_main

    (http_port,), engine_port = free_ports()
    args = frontend_main.parse_args(
        ["--host", "127.0.0.1", "--port", str(http_port), "--engine-bind", f"tcp://127.0.0.1:{engine_port}"]
    )
    url = f"http://127.0.0.1:{http_port}"
    tracer = PathTracer()
    threading.setprofile(tracer.profile)
    sys.setprofile(tracer.profile)
    server = asyncio.create_task(frontend_main._run(args))
    try:
        with engine_thread(engine_port):
            async with asyncio.timeout(120):
                model = await served_model(url)
                await stream_one(url, model, max_tokens)  # warm-up: lazy imports, first compiles
                tracer.start()
                await stream_one(url, model, max_tokens)
                tracer.enabled = False
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return tracer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens the traced request generates")
    parser.add_argument("--top", type=int, default=8, help="files listed per process, by entries")
    parser.add_argument(
        "--edges", type=int, default=0, help="also list this many most taken steps per process"
    )
    args = parser.parse_args()
    tracer = asyncio.run(trace_request(args.max_tokens))
    print(f"one streamed chat completion, built-in model with DFlash K=4, max_tokens {args.max_tokens}\n")
    print("| process | files | steps | revisits | distinct steps | most entered |")
    print("|---|---:|---:|---:|---:|---|")
    for name, path in tracer.paths.items():
        top = ", ".join(f"`{file.split('/', 1)[1]}` {n}" for file, n in path.entries.most_common(args.top))
        row = f"{len(path.entries)} | {path.steps} | {path.revisits} | {len(path.edges)}"
        print(f"| {name} | {row} | {top} |")
    total = Counter[str]()
    for path in tracer.paths.values():
        total.update(path.entries)
    steps = sum(p.steps for p in tracer.paths.values())
    revisits = sum(p.revisits for p in tracer.paths.values())
    edges = sum(len(p.edges) for p in tracer.paths.values())
    print(f"| both | {len(total)} | {steps} | {revisits} | {edges} | |")
    if args.edges:
        for name, path in tracer.paths.items():
            print(f"\n{name}: the most taken steps")
            for (a, b), n in path.edges.most_common(args.edges):
                print(f"  {n:4d}  {a.split('/', 1)[1]} -> {b.split('/', 1)[1]}")


if __name__ == "__main__":
    main()
