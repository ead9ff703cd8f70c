"""Errors the HTTP API answers with, in OpenAI's shape."""

from __future__ import annotations

import msgspec
from aiohttp import web


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers  # extra response headers (Retry-After)

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=msgspec.json.encode(self.body()),
            content_type="application/json",
            headers=self.headers,
        )


def invalid_request(message: str, param: str | None = None) -> ApiError:
    """400: the request body is malformed or asks for something impossible."""
    return ApiError(400, message, param=param)


def missing_parameter(path: str, param: str | None = None) -> ApiError:
    """400, OpenAI's words: the body lacks the required ``path`` (``param`` names its field; default: it)."""
    return ApiError(
        400,
        f"Missing required parameter: '{path}'.",
        param=path if param is None else param,
        code="missing_required_parameter",
    )


def engine_failed(message: str) -> ApiError:
    """500: the engine ended the request with an error (or died while running it)."""
    return ApiError(500, message, type_="server_error", code="engine_error")


def no_engine(message: str) -> ApiError:
    """503: no live engine can take the request now."""
    return ApiError(503, message, type_="service_unavailable", code="no_engine")


def overloaded(message: str, retry_after_s: int) -> ApiError:
    """503 with Retry-After: the bound on unfinished requests is reached; the client should retry later."""
    return retry_later(message, retry_after_s, "overloaded")


def retry_later(message: str, retry_after_s: int, code: str) -> ApiError:
    """503 with Retry-After: the server cannot take the request now (``code`` says why); retry later."""
    return ApiError(
        503, message, type_="service_unavailable", code=code, headers={"Retry-After": str(retry_after_s)}
    )
