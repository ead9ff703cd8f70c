"""What the HTTP server logs: an access line per request but the probes, and one quiet line per request too
malformed to parse (aiohttp answers those 400 itself)."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import BadHttpMessage

from openinfer.frontend.openai.middleware import REQUEST_IDENTITY


class QuietAccessLogger(AbstractAccessLogger):
    """Access log without the probes: /health and /metrics are polled every few hundred ms."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if request.path in ("/health", "/metrics"):
            return
        identity = request.get(REQUEST_IDENTITY)
        self.logger.info(
            '%s "%s %s" %d %.3fs request_id=%s',
            request.remote,
            request.method,
            request.path_qs,
            response.status,
            time,
            identity.request_id if identity is not None else "-",
        )


class _UnparsedRequests(logging.Filter):
    """aiohttp logs every request it cannot parse (a control byte in a header, a duplicate Host, a bad
    Content-Length) as an ERROR with a traceback after answering it 400, so any client could fill the log;
    such a record becomes one DEBUG line (kept only where DEBUG is on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, BadHttpMessage):
            return True
        record.msg, record.args = (
            "%s (answered 400): %s",
            (record.getMessage(), " ".join(error.message.split())),
        )
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def server_logger() -> logging.Logger:
    """The logger of the HTTP server's connection handlers (aiohttp's ``aiohttp.server`` otherwise)."""
    logger = logging.getLogger("openinfer.frontend.http")
    if not any(isinstance(f, _UnparsedRequests) for f in logger.filters):
        logger.addFilter(_UnparsedRequests())
    return logger
