"""Another api server's view, asked on its Unix socket, from this user's processes only.

Each api server answers ``GET /view`` on ``PEERS_DIR/api-server-i.sock``
(:mod:`~openinfer.frontend.metrics.api_servers`). Both ends check who the other is: the asking one takes an
answer only from a socket file of this user's, listened on by a process of this user's (``SO_PEERCRED``:
the credentials of the process that listened), and the answering one answers only a process of this user's.
So a socket planted by another user (where the peers folder let them) injects nothing, and another user who
can reach the socket learns nothing (a view names engine incarnations: what a process needs to pose as an
engine). The answer is read to at most ``limit + 1`` bytes, so that a peer cannot make this one hold more.

The request is plain HTTP/1.0, which has the answering api server close the connection after its answer:
the body is what comes before the end of the stream, and its ``Content-Length`` says it is whole.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import stat
import struct
from pathlib import Path

_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_OK = re.compile(rb"HTTP/1\.[01] 200 [^\r\n]*\r\n")
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d{1,15})[ \t]*\r\n")


class Stranger(OSError):
    """A socket in the peers folder that is not this user's, or a process of another user's at its end."""


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (for the connecting end: the one
    that listened, when it did)."""
    _, uid, _ = _CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))
    return uid


async def ask_view(path: Path, limit: int) -> bytes:
    """The body of the answer to ``GET /view`` on socket ``path``, whole, or cut at ``limit + 1`` bytes.
    :class:`Stranger` when the socket or its listener is not this user's; another OSError, EOFError or
    ``asyncio.LimitOverrunError`` when it does not answer 200 with a whole body (no api server there, dead,
    restarting); the caller bounds the time."""
    info = os.lstat(path)  # FileNotFoundError: none there
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise Stranger(f"{path} is not a socket of this user's (uid {info.st_uid}, mode {info.st_mode:o})")
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        uid = peer_uid(writer.get_extra_info("socket"))
        if uid != os.geteuid():
            raise Stranger(f"{path} is listened on by a process of another user (uid {uid})")
        writer.write(b"GET /view HTTP/1.0\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")  # bounded by the stream's limit (64 KiB)
        if _OK.match(head) is None:
            raise ConnectionError(f"it answered {head[:80]!r}")
        body = bytearray()
        while len(body) <= limit and (chunk := await reader.read(1 << 16)):
            body += chunk
    finally:
        writer.close()
    length = _LENGTH.search(head.lower())
    if len(body) <= limit and (length is None or int(length[1]) != len(body)):
        raise ConnectionError(f"its answer of {len(body)} bytes is not whole")
    return bytes(body[: limit + 1])
