"""What a web page on another origin can make a browser do to a local server: send only JSON bodies it may
not send without the server's consent (bodies are `application/json` or refused), read nothing (no CORS
headers unless --allowed-origins), and nothing through DNS rebinding (a loopback server serves loopback
Host names only). Over a real HTTP server with a real --fake-model engine process, or an engine peer where a
test checks that nothing reached the engine."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from openinfer.frontend.openai.cors import CorsPolicy
from tests.frontend.engine_peer import EnginePeer
from tests.frontend.frontends import FakeFrontendFactory, Frontend, FrontendFactory, PeerFactory

EVIL = "http://evil.example"
APP = "http://app.example:3000"
COMPLETION = {"prompt": "hello", "max_tokens": 2, "ignore_eos": True}


async def send(
    frontend: Frontend, method: str, path: str, data: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, CIMultiDictProxy[str]]:
    """(status, body as JSON or text, headers) of one request."""
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"{frontend.url}{path}", data=data, headers=headers) as response:
            text = await response.text()
            is_json = response.content_type == "application/json"
            return response.status, json.loads(text) if is_json else text, response.headers


def cors_headers(headers: CIMultiDictProxy[str]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower().startswith("access-control-")}


# ---- only JSON is JSON ----


def form_body() -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field(json.dumps(COMPLETION), "")  # a form whose one field's name is the JSON text
    return form


def multipart_body() -> aiohttp.MultipartWriter:
    writer = aiohttp.MultipartWriter("form-data")
    writer.append(json.dumps(COMPLETION)).set_content_disposition("form-data", name="body")
    return writer


@pytest.mark.parametrize(
    "make_body",
    [
        lambda: aiohttp.payload.StringPayload(json.dumps(COMPLETION), content_type="text/plain"),
        form_body,
        multipart_body,
    ],
    ids=["text/plain", "form-urlencoded", "multipart"],
)
async def test_json_sent_as_another_type_from_another_origin_is_refused(
    frontend: Frontend, peer: EnginePeer, make_body: Any
) -> None:
    """A JSON body sent as text/plain, form-urlencoded or multipart (what an HTML form on another origin
    can send without a preflight): vLLM's 400, in OpenAI's shape, and the engine never hears of it."""
    status, body, headers = await send(frontend, "POST", "/v1/completions", make_body(), {"Origin": EVIL})
    assert status == 400 and body["error"]["code"] == "unsupported_media_type"
    assert "Only 'application/json' is allowed" in body["error"]["message"]
    assert peer.requests == {} and cors_headers(headers) == {}


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/v1/completions", None),  # aiohttp sends bytes as application/octet-stream
        ("/v1/chat/completions", "text/plain;charset=UTF-8"),
        ("/admin/engines/0/drafter", "application/x-www-form-urlencoded"),
        ("/v1/completions", "application/jsonx"),
        ("/v1/completions", "application/vnd.api+json"),
    ],
)
async def test_every_body_route_takes_application_json_only(
    start_frontend: FrontendFactory, start_peer: PeerFactory, path: str, content_type: str | None
) -> None:
    """Each route with a body, the admin route too, refuses any other media type (and no type at all)."""
    frontend = await start_frontend(admin_api_key="k")
    peer = await start_peer(frontend)
    headers = {"Authorization": "Bearer k"} | ({"Content-Type": content_type} if content_type else {})
    status, body, _ = await send(frontend, "POST", path, b'{"method": "ngram"}', headers)
    assert (status, body["error"]["code"]) == (400, "unsupported_media_type")
    assert peer.requests == {} and peer.drafter_commands == []


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
async def test_application_json_with_parameters_is_json(fake_frontend: Frontend, content_type: str) -> None:
    """application/json in any case and with parameters is served."""
    headers = {"Content-Type": content_type}
    status, body, _ = await send(fake_frontend, "POST", "/v1/completions", json.dumps(COMPLETION), headers)
    assert status == 200 and body["usage"]["completion_tokens"] == 2


async def test_routes_without_bodies_and_unknown_routes_are_unaffected(fake_frontend: Frontend) -> None:
    """GET routes need no Content-Type; a POST to no route is still a 404."""
    assert (await send(fake_frontend, "GET", "/v1/models"))[0] == 200
    status, body, _ = await send(fake_frontend, "POST", "/v1/nothing", b"x", {"Content-Type": "text/plain"})
    assert (status, body["error"]["code"]) == (404, "not_found")


# ---- CORS ----


async def test_no_cors_headers_by_default(fake_frontend: Frontend) -> None:
    """Without --allowed-origins no response carries an Access-Control-* header, and a preflight is not
    answered as one (405): a browser lets no other origin read an answer or send JSON."""
    origin = {"Origin": EVIL}
    for method, path, data, headers in [
        ("GET", "/v1/models", None, origin),
        ("POST", "/v1/completions", json.dumps(COMPLETION), origin | {"Content-Type": "application/json"}),
        ("OPTIONS", "/v1/completions", None, origin | {"Access-Control-Request-Method": "POST"}),
    ]:
        status, _, response_headers = await send(fake_frontend, method, path, data, headers)
        assert status == (405 if method == "OPTIONS" else 200)
        assert cors_headers(response_headers) == {}


@pytest.fixture
async def cors_frontend(start_fake_frontend: FakeFrontendFactory) -> Frontend:
    """--allowed-origins '["http://app.example:3000"]' --allowed-methods '["GET", "POST"]'
    --allowed-headers '["Authorization"]' --allow-credentials, and an API key; on the fake engine."""
    policy = CorsPolicy((APP,), ("GET", "POST"), ("Authorization",), allow_credentials=True)
    return await start_fake_frontend(api_key="key", cors=policy)


async def test_an_allowed_origin_may_read_answers_and_streams(cors_frontend: Frontend) -> None:
    """A response to an allowed origin names it (with credentials, Vary: Origin); errors and streams too."""
    base = {"Origin": APP, "Authorization": "Bearer key", "Content-Type": "application/json"}
    expected = {"Access-Control-Allow-Origin": APP, "Access-Control-Allow-Credentials": "true"}
    for headers, body, status in [
        (base, COMPLETION, 200),
        (base, COMPLETION | {"stream": True}, 200),
        (base | {"Authorization": "Bearer wrong"}, COMPLETION, 401),
    ]:
        got, _, response_headers = await send(
            cors_frontend, "POST", "/v1/completions", json.dumps(body), headers
        )
        assert got == status
        assert cors_headers(response_headers) == expected and response_headers["Vary"] == "Origin"


async def test_another_origin_is_told_nothing(cors_frontend: Frontend) -> None:
    """A response to an origin not allowed carries no Access-Control-Allow-Origin."""
    headers = {"Origin": EVIL, "Authorization": "Bearer key"}
    status, _, response_headers = await send(cors_frontend, "GET", "/v1/models", headers=headers)
    assert status == 200 and "Access-Control-Allow-Origin" not in response_headers


async def test_preflights_are_answered_before_authentication(cors_frontend: Frontend) -> None:
    """A preflight (which never carries the key) from an allowed origin: 200 with what it may send; from
    another origin, or for a method or header not allowed: 400 naming what is disallowed, without the
    allowing origin."""
    preflight = {"Origin": APP, "Access-Control-Request-Method": "POST"}
    status, text, headers = await send(
        cors_frontend,
        "OPTIONS",
        "/v1/completions",
        headers=preflight | {"Access-Control-Request-Headers": "authorization, content-type"},
    )
    assert (status, text) == (200, "OK")
    assert cors_headers(headers) == {
        "Access-Control-Allow-Origin": APP,
        "Access-Control-Allow-Methods": "GET, POST",
        "Access-Control-Allow-Headers": "accept, accept-language, authorization, content-language, content-type",
        "Access-Control-Allow-Credentials": "true",
        "Access-Control-Max-Age": "600",
    }
    for headers, disallowed in [
        (preflight | {"Origin": EVIL}, "origin"),
        (preflight | {"Access-Control-Request-Method": "DELETE"}, "method"),
        (preflight | {"Access-Control-Request-Headers": "x-evil"}, "headers"),
    ]:
        status, body, response_headers = await send(
            cors_frontend, "OPTIONS", "/v1/completions", headers=headers
        )
        assert status == 400 and body["error"]["message"].startswith(f"Disallowed CORS {disallowed}")
        assert response_headers.get("Access-Control-Allow-Origin") != EVIL


async def test_any_origin_is_a_star(start_frontend: FrontendFactory) -> None:
    """--allowed-origins '["*"]' (vLLM's default): responses say "*"; a preflight echoes the asked headers."""
    frontend = await start_frontend(cors=CorsPolicy(("*",)))
    _, _, headers = await send(frontend, "GET", "/health", headers={"Origin": EVIL})
    assert cors_headers(headers) == {"Access-Control-Allow-Origin": "*"}
    preflight = {
        "Origin": EVIL,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "x-a",
    }
    status, _, headers = await send(frontend, "OPTIONS", "/v1/completions", headers=preflight)
    assert status == 200
    assert (headers["Access-Control-Allow-Origin"], headers["Access-Control-Allow-Headers"]) == ("*", "x-a")


# ---- the Host rule of a loopback server ----


@pytest.fixture
async def loopback_frontend(start_frontend: FrontendFactory) -> Frontend:
    return await start_frontend(loopback_host="127.0.0.1")


@pytest.mark.parametrize(
    "host", ["localhost:8000", "127.0.0.1:8000", "[::1]:8000", "localhost", "LOCALHOST:1", "127.0.0.2"]
)
async def test_a_loopback_server_serves_loopback_host_names(
    start_fake_frontend: FakeFrontendFactory, host: str
) -> None:
    """localhost, 127.0.0.0/8 and [::1], with any port or none: served."""
    loopback_frontend = await start_fake_frontend(loopback_host="127.0.0.1")
    headers = {"Host": host, "Content-Type": "application/json"}
    status, body, _ = await send(
        loopback_frontend, "POST", "/v1/completions", json.dumps(COMPLETION), headers
    )
    assert status == 200, body


@pytest.mark.parametrize(
    "host",
    ["evil.example:8000", "evil.example", "127.0.0.1.evil.example", "localhost.evil.example:8000", "[::2]:8000",
     "0.0.0.0:8000", "::1", "evil@127.0.0.1"],
)  # fmt: skip
async def test_a_loopback_server_refuses_other_host_names(
    loopback_frontend: Frontend, start_peer: PeerFactory, host: str
) -> None:
    """Any other Host (a rebinding page's own name): 400 saying how to listen elsewhere; nothing runs."""
    peer = await start_peer(loopback_frontend)
    for method, path in [("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/metrics")]:
        headers = {"Host": host, "Content-Type": "application/json"}
        status, body, _ = await send(loopback_frontend, method, path, json.dumps(COMPLETION), headers)
        assert (status, body["error"]["code"]) == (400, "invalid_host")
        assert "--host 0.0.0.0" in body["error"]["message"]
    assert peer.requests == {}


async def test_without_the_loopback_rule_any_host_is_served(fake_frontend: Frontend) -> None:
    """A server not listening on loopback (no loopback_host) is reached by names it cannot know: any Host."""
    headers = {"Host": "evil.example:8000", "Content-Type": "application/json"}
    status, _, _ = await send(fake_frontend, "POST", "/v1/completions", json.dumps(COMPLETION), headers)
    assert status == 200
