"""The api servers of one ``openinfer-serve --api-server-count N``, as one server to scrape.

The N frontends share the HTTP port (``SO_REUSEPORT``: the kernel spreads connections), so a scrape reaches
any one of them and must return the whole server's metrics. Each frontend (api server ``i``) also listens on
a Unix socket ``PEERS_DIR/api-server-i.sock`` where it answers with its own :class:`ApiServerView`: its
exposition (its requests' metrics, and the counters and gauges of the engines it is the metrics frontend of)
and the spec-log seqs those counters hold. A scrape of the shared port sums every api server's exposition
(:func:`~openinfer.frontend.metrics.exposition_sum.sum_expositions`) and joins their counted seqs.

Monotonic through a frontend's death: a view is written to ``PEERS_DIR/api-server-i.view`` (atomically)
before it is shown to anyone, after the ``--state-dir`` save that a restarted frontend continues from. An
api server that does not answer (dead, being restarted) is shown by that file: nothing any scrape showed of
it is missing, so no series goes down, and its restart continues from at least what the file holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web

from openinfer.frontend.engines.log_limit import LogRateLimiter
from openinfer.frontend.metrics.counted_seqs import CountedSeqs, counted_json
from openinfer.frontend.metrics.exposition_sum import sum_expositions
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics

logger = logging.getLogger(__name__)

# How long a scrape waits for another api server's view before it takes its file instead.
_PEER_TIMEOUT_S = 2.0


class ApiServerView(msgspec.Struct):
    """What one api server shows: its exposition, and by engine index the seqs its counters hold."""

    exposition: str
    counted_seqs: dict[int, list[CountedSeqs]]


class ApiServers:
    """This frontend as api server ``index`` of ``count`` whose Unix sockets and views are in ``directory``
    (a folder only this user can read: the sockets are not authenticated otherwise)."""

    def __init__(self, metrics: FrontendMetrics, directory: Path, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"--api-server-index must be in 0..{count - 1}, got {index}")
        self.metrics = metrics
        self.directory = directory
        self.index = index
        self.count = count
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(ApiServerView)
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
        self.socket_path(self.index).unlink(missing_ok=True)  # a dead start's
        await web.UnixSite(self._runner, str(self.socket_path(self.index))).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def own_view(self) -> bytes:
        """This api server's view, saved to its file before it is returned (the state is saved first)."""
        view = ApiServerView(self.metrics.render().decode(), self.metrics.counted_seqs.saved())
        data = self._encoder.encode(view)
        path = self.view_path(self.index)
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_bytes(data)
        os.replace(temp, path)
        return data

    async def views(self) -> list[ApiServerView]:
        """Every api server's view: this one's now, the others' as they answer, or their files."""
        own = self._decoder.decode(self.own_view())
        others = await asyncio.gather(*(self._view_of(i) for i in range(self.count) if i != self.index))
        return [own, *(view for view in others if view is not None)]

    async def exposition(self) -> bytes:
        """The whole server's ``/metrics``."""
        return sum_expositions(view.exposition for view in await self.views())

    async def counted_seqs(self) -> dict[str, list[dict[str, object]]]:
        """The whole server's counted seqs, as ``/admin/engines`` shows them (each engine's are its metrics
        frontend's; an index that moved between frontends has each one's runs)."""
        joined: dict[int, list[CountedSeqs]] = {}
        for view in await self.views():
            for index, runs in view.counted_seqs.items():
                joined.setdefault(index, []).extend(runs)
        return counted_json(joined)

    async def _answer(self, request: web.Request) -> web.Response:
        return web.Response(body=self.own_view(), content_type="application/msgpack")

    async def _view_of(self, index: int) -> ApiServerView | None:
        """Api server ``index``'s view from its socket, else from its file; None when it never wrote one."""
        try:
            connector = aiohttp.UnixConnector(path=str(self.socket_path(index)))
            timeout = aiohttp.ClientTimeout(total=_PEER_TIMEOUT_S)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                async with session.get("http://api-server/view") as response:
                    if response.status == 200:
                        return self._decoder.decode(await response.read())
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError, OSError) as e:
            self._log.info("peer", "api server %d did not answer (%s); its last view is shown", index, e)
        try:
            return self._decoder.decode(self.view_path(index).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError) as e:
            self._log.warning("peer-file", "cannot read api server %d's last view: %s", index, e)
            return None
