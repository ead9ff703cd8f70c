"""The api servers of one ``openinfer-serve --api-server-count N``, as one server to scrape.

The N frontends share the HTTP port (one socket serve binds: whichever accepts first takes it), so a scrape reaches
any one of them and must return the whole server's metrics. Each frontend (api server ``i``) also listens on
a Unix socket ``PEERS_DIR/api-server-i.sock`` where it answers with its own :class:`ApiServerView`: its
exposition (its requests' metrics, and the counters and gauges of the engines it is the metrics frontend of)
and the spec-log seqs those counters hold. A scrape of the shared port sums every api server's exposition
(:class:`~openinfer.frontend.metrics.exposition_sum.ExpositionSum`) and joins their counted seqs.

Monotonic through a frontend's death: a view is written to ``PEERS_DIR/api-server-i.view`` (atomically)
before it is shown to anyone, after the ``--state-dir`` save that a restarted frontend continues from. An
api server that does not answer (dead, being restarted) is shown by that file: nothing any scrape showed of
it is missing, so no series goes down, and its restart continues from at least what the file holds.

Whatever another api server shows is input from another process, held to what one can show. The peers folder
must be this user's and no one else's to write (checked at start: in a folder others can write, they could
plant links, views and sockets of their own); the socket answers and is answered by this user's processes
only (:mod:`~openinfer.frontend.metrics.peer_socket`); a view file is written 0600 through a temporary file
that no planted link diverts, and read only when it is a regular file of this user's. A view that is not
one, or holds what no api server exports (:mod:`~openinfer.frontend.metrics.peer_view`), is left out of the
scrape (its series are missing from it, none goes down), logged at a bounded rate and counted in
``openinfer:protocol_errors_total{kind="peer_view"}``; a socket or file that is not this user's is not
used, and counted as ``kind="peer_stranger"``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import msgspec
from aiohttp import web

from openinfer.frontend.log_limit import LogRateLimiter
from openinfer.frontend.metrics.exposition_sum import ExpositionSum
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.frontend.metrics.peer_socket import Stranger, ask_view, peer_uid
from openinfer.frontend.metrics.peer_view import (
    MAX_VIEW_BYTES,
    ApiServerView,
    BadView,
    ParsedView,
    parse_own,
    parse_peer,
)
from openinfer.frontend.metrics.spec_decode.counted_seqs import CountedSeqs, counted_json
from openinfer.protocol.private_file import READ, check_private_folder, open_private, replace_private

__all__ = ["ApiServerView", "ApiServers"]
logger = logging.getLogger(__name__)

# How long a scrape waits for another api server's view before it takes its file instead.
_PEER_TIMEOUT_S = 2.0


class ApiServers:
    """This frontend as api server ``index`` of ``count`` whose Unix sockets and views are in ``directory``
    (``--peers-dir``: OSError, saying what to do, unless it is this user's and no one else may write it)."""

    def __init__(self, metrics: FrontendMetrics, directory: Path, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"--api-server-index must be in 0..{count - 1}, got {index}")
        try:
            check_private_folder(directory)
        except OSError as e:
            raise OSError(f"--peers-dir: {e}") from None
        self.metrics = metrics
        self.directory = directory
        self.index = index
        self.count = count
        self._encoder = msgspec.msgpack.Encoder()
        self._runner: web.AppRunner | None = None
        self._log = LogRateLimiter(logger)

    def socket_path(self, index: int) -> Path:
        return self.directory / f"api-server-{index}.sock"

    def view_path(self, index: int) -> Path:
        return self.directory / f"api-server-{index}.view"

    async def start(self) -> None:
        """Answer the other api servers on this one's Unix socket."""
        app = web.Application()
        app.router.add_get("/view", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        path = self.socket_path(self.index)
        path.unlink(missing_ok=True)  # a dead start's
        await web.UnixSite(self._runner, str(path)).start()
        path.chmod(0o600)  # connecting takes write permission: this user's processes only

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def own_view(self) -> ApiServerView:
        """This api server's view, saved to its file before it is returned (the state is saved first)."""
        view = ApiServerView(self.metrics.render().decode(), self.metrics.counted_seqs.saved())
        replace_private(self.view_path(self.index), self._encoder.encode(view))
        return view

    async def views(self) -> list[ParsedView]:
        """Every api server's view: this one's now, the others' as they answer, or their files; a peer's
        view that fails its checks is left out."""
        own = parse_own(self.own_view())
        others = await asyncio.gather(*(self._view_of(i, own) for i in range(self.count) if i != self.index))
        return [own, *(view for view in others if view is not None)]

    async def exposition(self) -> bytes:
        """The whole server's ``/metrics``."""
        own, *others = await self.views()
        total = ExpositionSum()
        total.add(own.families)
        for view in others:
            try:
                total.add(view.families)
            except ValueError as e:  # a family of another type there than here
                self._refuse("peer_view", "an api server's view is left out of /metrics: %s", e)
        return total.render()

    async def counted_seqs(self) -> dict[str, list[dict[str, object]]]:
        """The whole server's counted seqs, as ``/admin/engines`` shows them (each engine's are its metrics
        frontend's; an index that moved between frontends has each one's runs)."""
        joined: dict[int, list[CountedSeqs]] = {}
        for view in await self.views():
            for index, runs in view.counted_seqs.items():
                joined.setdefault(index, []).extend(runs)
        return counted_json(joined)

    async def _answer(self, request: web.Request) -> web.Response:
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        uid = peer_uid(sock) if sock is not None else None
        if uid != os.geteuid():
            self._refuse("peer_stranger", "a process of uid %s asked for this api server's view", uid)
            raise web.HTTPForbidden()
        return web.Response(body=self._encoder.encode(self.own_view()), content_type="application/msgpack")

    async def _view_of(self, index: int, own: ParsedView) -> ParsedView | None:
        """Api server ``index``'s view from its socket, else from its file, checked; None when it has none
        to show."""
        data: bytes | None = None
        try:
            async with asyncio.timeout(_PEER_TIMEOUT_S):
                data = await ask_view(self.socket_path(index), MAX_VIEW_BYTES)
        except Stranger as e:
            self._refuse("peer_stranger", "api server %d's socket is not used: %s", index, e)
        except (OSError, EOFError, asyncio.LimitOverrunError, TimeoutError) as e:
            self._log.info("peer", "api server %d did not answer (%r); its last view is shown", index, e)
        if data is None:
            data = self._read_file(index)
        if data is None:
            return None
        try:
            return parse_peer(data, own)
        except BadView as e:
            self._refuse("peer_view", "api server %d's view is left out of /metrics: %s", index, e)
            return None

    def _read_file(self, index: int) -> bytes | None:
        """Api server ``index``'s last view file (at most one byte past the largest view); None when there
        is none, or it is not a regular file of this user's."""
        try:
            with os.fdopen(open_private(self.view_path(index), READ), "rb") as f:
                return f.read(MAX_VIEW_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._refuse("peer_stranger", "api server %d's view file is not read: %s", index, e)
            return None

    def _refuse(self, kind: str, message: str, *args: object) -> None:
        """Count a refused peer input as a protocol error of ``kind``, and log it at a bounded rate."""
        self.metrics.count_protocol_error(kind)
        self._log.warning(kind, message, *args)
