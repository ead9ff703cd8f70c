"""CORS, only when asked for (``--allowed-origins``): which pages on other origins a browser lets call the API.

The rules are those of Starlette's ``CORSMiddleware``, which vLLM serves its flags with (``--allowed-origins``,
``--allowed-methods``, ``--allowed-headers``, ``--allow-credentials``): a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) from an allowed origin is answered 200 with what it may send, from any
other 400 naming what is disallowed; every other response to a request with an ``Origin`` gets the
``Access-Control-Allow-*`` headers its origin earns. Without a policy the server sends no CORS header at
all, so a browser lets no other origin read an answer or send a JSON body (see ``json_body_middleware``).
Written out here because aiohttp-cors registers origins per route and answers differently from vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from openinfer.frontend.openai.errors import ApiError
from openinfer.frontend.openai.middleware import Handler

ANY = "*"
# What "*" in --allowed-methods stands for (Starlette's ALL_METHODS)
ALL_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
# Request headers a browser may always send (the Fetch standard's CORS-safelisted ones)
SAFELISTED_HEADERS = ("Accept", "Accept-Language", "Content-Language", "Content-Type")
PREFLIGHT_MAX_AGE_S = 600  # how long a browser may cache a preflight's answer (Starlette's default)


@dataclass(frozen=True)
class CorsPolicy:
    """vLLM's CORS flags; ``"*"`` in a list allows any."""

    allowed_origins: tuple[str, ...]  # e.g. ("http://localhost:3000",); exact matches, scheme and port too
    allowed_methods: tuple[str, ...] = (ANY,)
    allowed_headers: tuple[str, ...] = (ANY,)
    allow_credentials: bool = False  # cookies and Authorization may come along (the origin is echoed then)

    def __post_init__(self) -> None:
        if not self.allowed_origins:
            raise ValueError("a CORS policy needs at least one allowed origin (or none at all: no CORS)")

    @property
    def any_origin(self) -> bool:
        return ANY in self.allowed_origins

    @property
    def methods(self) -> tuple[str, ...]:
        return ALL_METHODS if ANY in self.allowed_methods else self.allowed_methods

    def allows_origin(self, origin: str) -> bool:
        return self.any_origin or origin in self.allowed_origins

    def preflight_middleware(self) -> Middleware:
        """Answers preflights; it must run before authentication, which a browser's preflight never carries."""

        @web.middleware
        async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
            origin = request.headers.get("Origin")
            method = request.headers.get("Access-Control-Request-Method")
            if request.method != "OPTIONS" or origin is None or method is None:
                return await handler(request)
            return self._preflight(origin, method, request.headers.get("Access-Control-Request-Headers"))

        return preflight

    def _preflight(self, origin: str, method: str, requested_headers: str | None) -> web.Response:
        """Starlette's answer to a preflight: 200 "OK", or 400 saying what is disallowed; both with the
        headers that say what is allowed."""
        headers = {
            "Access-Control-Allow-Methods": ", ".join(self.methods),
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
        }
        explicit = not self.any_origin or self.allow_credentials  # "*" is no answer for credentials
        if explicit:
            headers["Vary"] = "Origin"
        else:
            headers["Access-Control-Allow-Origin"] = ANY
        if self.allow_credentials:
            headers["Access-Control-Allow-Credentials"] = "true"
        allowed_headers = {h.lower() for h in (*SAFELISTED_HEADERS, *self.allowed_headers)}
        if ANY in self.allowed_headers:
            if requested_headers is not None:
                headers["Access-Control-Allow-Headers"] = requested_headers
        else:
            headers["Access-Control-Allow-Headers"] = ", ".join(sorted(allowed_headers))
        disallowed = []
        if not self.allows_origin(origin) or (explicit and not _echoable(origin)):
            disallowed.append("origin")
        elif explicit:
            headers["Access-Control-Allow-Origin"] = origin
        if method not in self.methods:
            disallowed.append("method")
        if ANY not in self.allowed_headers and requested_headers is not None:
            if any(h.strip().lower() not in allowed_headers for h in requested_headers.split(",")):
                disallowed.append("headers")
        if not disallowed:
            return web.Response(text="OK", headers=headers)
        message = (
            f"Disallowed CORS {', '.join(disallowed)}: this server allows origins {list(self.allowed_origins)}, "
            f"methods {list(self.methods)} and headers {list(self.allowed_headers)} (--allowed-origins, "
            "--allowed-methods, --allowed-headers)"
        )
        return ApiError(400, message, code="cors_disallowed", headers=headers).response()

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """What a response to a request from ``Origin`` says it may read (Starlette's simple response); an
        ``on_response_prepare`` signal, so that streams and errors get them too."""
        origin = request.headers.get("Origin")
        if origin is None or "Access-Control-Allow-Methods" in response.headers:  # none, or a preflight
            return
        if self.any_origin:
            response.headers["Access-Control-Allow-Origin"] = ANY
        if self.allow_credentials:
            response.headers["Access-Control-Allow-Credentials"] = "true"
        mirrored = self.any_origin and "Cookie" in request.headers  # with a cookie "*" does not do
        if (mirrored or not self.any_origin) and self.allows_origin(origin) and _echoable(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            vary = response.headers.get("Vary")
            response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"


def _echoable(origin: str) -> bool:
    """Whether ``origin`` can go back in a response header as it came (printable ASCII): a header of other
    bytes is decoded with surrogates, which would fail the response."""
    return origin.isascii() and origin.isprintable()
