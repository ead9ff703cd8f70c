"""The middlewares every route runs through: request ids, the API key, JSON bodies only, OpenAI error
bodies."""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from openinfer.frontend.engines.errors import EngineOverloadedError
from openinfer.frontend.openai.errors import ApiError, invalid_request, overloaded

logger = logging.getLogger(__name__)

# Routes that answer without an API key: probes and Prometheus scrapes.
OPEN_PATHS = frozenset({"/health", "/metrics"})
# Prompts given as text or token ids can be long; aiohttp's default body limit is 1 MiB.
MAX_BODY_BYTES = 64 * 1024 * 1024
# A request's id: the client's X-Request-Id when it sends one, else a fresh one; echoed in the response.
REQUEST_ID_HEADER = "X-Request-Id"
_MAX_REQUEST_ID_CHARS = 256
# Methods whose requests carry a body; every route that takes one takes JSON
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class RequestIdentity:
    """The id of one HTTP request, for its response, its log lines and its engine request."""

    request_id: str
    from_client: bool  # given in the X-Request-Id header (so it may be reused; engine ids get a suffix)


REQUEST_IDENTITY = web.RequestKey("openinfer_request_identity", RequestIdentity)


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request's id: the client's X-Request-Id (1 to 256 visible ASCII characters), or a new one."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None:
        request[REQUEST_IDENTITY] = RequestIdentity(uuid.uuid4().hex, from_client=False)
    elif 0 < len(given) <= _MAX_REQUEST_ID_CHARS and all("!" <= c <= "~" for c in given):
        request[REQUEST_IDENTITY] = RequestIdentity(given, from_client=True)
    else:
        raise invalid_request(
            f"the {REQUEST_ID_HEADER} header must be 1 to {_MAX_REQUEST_ID_CHARS} visible ASCII characters "
            "(no spaces)"
        )
    return await handler(request)


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every response carries its request's id (errors and streams too), set just before headers go out."""
    identity = request.get(REQUEST_IDENTITY)
    if identity is not None:
        response.headers[REQUEST_ID_HEADER] = identity.request_id


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as an OpenAI error body, including aiohttp's own (404 route, 405, 413)."""
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except EngineOverloadedError as e:  # from any route that adds requests: 503 + Retry-After
        return overloaded(str(e), e.retry_after_s).response()
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _http_error(request, e)
    except Exception:  # noqa: BLE001 - a bug must still answer in OpenAI's shape
        identity = request.get(REQUEST_IDENTITY)
        request_id = identity.request_id if identity is not None else "-"
        logger.exception("error while serving %s %s (request %s)", request.method, request.path, request_id)
        return ApiError(500, "internal server error; see the frontend's log", type_="server_error").response()


def _http_error(request: web.Request, error: web.HTTPException) -> web.Response:
    """aiohttp's own errors in OpenAI's shape, saying what to do; 405 keeps its Allow header."""
    route = f"{request.method} {request.path}"
    if error.status == 404:
        message = f"no route {route}; openinfer serves /v1/completions, /v1/chat/completions, /v1/models"
        response = ApiError(404, message, code="not_found").response()
    elif error.status == 405:
        allowed = error.headers.get("Allow", "")
        message = (
            f"method {request.method} is not allowed on {request.path}; use {allowed or 'another method'}"
        )
        response = ApiError(405, message, code="method_not_allowed").response()
        if allowed:
            response.headers["Allow"] = allowed
    elif error.status == 413:
        message = f"the request body exceeds {MAX_BODY_BYTES} bytes"
        response = ApiError(413, message, code="request_too_large").response()
    else:
        response = ApiError(error.status, f"{route}: {error.reason}").response()
    return response


@web.middleware
async def json_body_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request body is JSON sent as ``application/json`` and nothing else (vLLM's rule, and its 400): a page
    on another origin can make a browser send a text/plain, form or multipart body without asking the
    server first, never an application/json one (that needs a CORS preflight this server must allow)."""
    if request.method in _BODY_METHODS and request.match_info.http_exception is None:
        content_type = request.headers.get("Content-Type", "")
        if content_type.partition(";")[0].strip().lower() != "application/json":
            raise ApiError(
                400,
                "Unsupported Media Type: Only 'application/json' is allowed; send the JSON body with "
                f"`Content-Type: application/json` (got {content_type!r})",
                code="unsupported_media_type",
            )
    return await handler(request)


def auth_middleware(api_key: str | None, admin_api_key: str | None = None) -> Middleware:
    """``Authorization: Bearer KEY`` checks: ``api_key`` on every route but :data:`OPEN_PATHS` and /admin;
    on /admin, ``admin_api_key`` when set, else ``api_key``. The admin routes are off (403) without either:
    they change what engines run, so they are never open."""
    admin_key = admin_api_key if admin_api_key is not None else api_key

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path == "/admin" or path.startswith("/admin/"):
            if admin_key is None:
                raise ApiError(
                    403,
                    "The admin API is off: start openinfer-frontend or openinfer-serve with --admin-api-key "
                    "(or $OPENINFER_ADMIN_API_KEY) or --api-key (or $OPENINFER_API_KEY) to use it, with that "
                    "key as `Authorization: Bearer KEY`.",
                    type_="permission_error",
                    code="admin_api_disabled",
                )
            _check_key(request, admin_key)
        elif api_key is not None and path not in OPEN_PATHS:
            _check_key(request, api_key)
        return await handler(request)

    return auth


def _check_key(request: web.Request, key: str) -> None:
    """401 unless the request carries ``Authorization: Bearer <key>`` (compared in constant time, as bytes:
    a header that is not UTF-8 was decoded with surrogates, which ``surrogateescape`` turns back)."""
    given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(given, f"Bearer {key}".encode("utf-8", "surrogateescape")):
        raise ApiError(
            401,
            "Incorrect or missing API key: send the server's key as `Authorization: Bearer KEY`.",
            code="invalid_api_key",
        )
