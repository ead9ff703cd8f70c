"""The Host rule of a server that listens on a loopback address: requests must be addressed to a loopback name.

This defeats DNS rebinding. A page of ``evil.example`` whose name the attacker then points at 127.0.0.1 is,
to the browser, the same origin as this server: CORS lets it read every answer. But the browser still sends
``Host: evil.example``, which no client of a loopback server has a reason to send, so such requests are
refused. A server that listens on another address is reached by names this one cannot know: no rule there.
"""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.typedefs import Middleware

from openinfer.frontend.addresses import is_loopback_host
from openinfer.frontend.openai.errors import ApiError
from openinfer.frontend.openai.middleware import Handler

# A Host header: a name or IPv4 address, or a bracketed IPv6 address, and an optional port.
_HOST = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\[\]:@/\s]+)(?::[0-9]*)?")


def loopback_host(host_header: str) -> bool:
    """Whether a Host header names this machine's loopback: ``localhost``, an address in 127.0.0.0/8 or
    ``[::1]``, with any port (``localhost:8000``, ``127.0.0.1:8000``, ``[::1]:8000``)."""
    match = _HOST.fullmatch(host_header)
    return match is not None and is_loopback_host(match["host"].lower())


def host_check_middleware(listen_host: str) -> Middleware:
    """Refuse (400) a request whose Host header is not a loopback name or address, for a server listening
    on the loopback address ``listen_host``. A request without a Host header passes: HTTP/1.1 requires one,
    and a browser, the only tool of a rebinding attack, always sends it."""

    @web.middleware
    async def host_check(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if host is not None and not loopback_host(host):
            raise ApiError(
                400,
                f"this server listens on {listen_host}, a loopback address, and answers only requests "
                f"addressed to localhost, 127.0.0.1 or [::1], not Host {host!r} (so that a web page whose "
                "name was pointed at this machine cannot use it). To serve it under other names, listen on "
                "another address (--host 0.0.0.0, or this host's address) and set an API key (--api-key)",
                code="invalid_host",
            )
        return await handler(request)

    return host_check
