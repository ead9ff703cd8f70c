"""Admin routes against engine peers: drafter load/unload through DrafterReply, validation, errors, auth
(off without a key, their own key or the API key)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from openinfer.frontend.openai.admin_api import MAX_BODY_BYTES
from openinfer.protocol import LoadDrafter, UnloadDrafter
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.waits import wait_until

ADMIN_KEY = "admin-sesame"


@pytest.fixture
async def frontend(start_frontend: FrontendFactory) -> Frontend:
    """A frontend whose admin routes are on: they need a key."""
    return await start_frontend(admin_api_key=ADMIN_KEY)


async def admin(
    frontend: Frontend, method: str, path: str, body: object = None, key: str | None = ADMIN_KEY
) -> tuple[int, Any]:
    """(status, JSON body) of an admin request sent with ``key`` (None: no Authorization header)."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"{frontend.url}{path}", json=body, headers=headers) as response:
            return response.status, await response.json()


async def test_load_and_unload_a_drafter(frontend: Frontend, peer: EnginePeer) -> None:
    """POST sends LoadDrafter and answers with the engine's reply; DELETE sends UnloadDrafter; both listed."""
    status, body = await admin(frontend, "POST", "/admin/engines/0/drafter",
                               {"method": "ngram", "num_spec_tokens": 4, "prompt_lookup_max": 3})  # fmt: skip
    assert status == 200
    assert body == {"engine": 0, "num_spec_tokens": 4, "message": "loaded the ngram drafter with K=4"}
    [command] = peer.drafter_commands
    assert isinstance(command, LoadDrafter) and len(command.command_id) == 32  # a uuid4, hex
    assert (command.method, command.num_spec_tokens, command.draft_model) == ("ngram", 4, None)
    assert (command.prompt_lookup_min, command.prompt_lookup_max) == (1, 3)

    status, body = await admin(frontend, "GET", "/admin/engines")
    [engine] = body["engines"]
    assert status == 200
    listed = {key: engine[key] for key in ("index", "incarnation", "up", "model", "num_spec_tokens")}
    incarnation = f"{peer.incarnation:016x}"  # as in the spec log
    assert listed == {
        "index": 0,
        "incarnation": incarnation,
        "up": True,
        "model": "tiny",
        "num_spec_tokens": 4,
    }
    assert engine["load"]["spec_decode"]["num_spec_tokens"] == 4  # the reply's load, right after loading
    assert engine["load"]["spec_decode"]["accepted_length_hist"] == [0, 0, 0, 0, 0]

    status, body = await admin(frontend, "DELETE", "/admin/engines/0/drafter")
    assert (status, body) == (
        200,
        {"engine": 0, "num_spec_tokens": None, "message": "speculative decoding is off"},
    )
    assert isinstance(peer.drafter_commands[-1], UnloadDrafter)
    _, body = await admin(frontend, "GET", "/admin/engines")
    assert body["engines"][0]["num_spec_tokens"] is None and body["engines"][0]["load"]["spec_decode"] is None


async def test_engine_refusal_is_400_with_its_message(frontend: Frontend, start_peer: PeerFactory) -> None:
    """A DrafterReply with ok false: 400, OpenAI error shape, the engine's message verbatim."""
    await start_peer(
        frontend, PeerConfig(refuse_drafter="no DFlash checkpoint at /nope: config.json missing")
    )
    dflash = {"method": "dflash", "num_spec_tokens": 8, "draft_model": "/nope"}
    status, body = await admin(frontend, "POST", "/admin/engines/0/drafter", dflash)
    assert status == 400
    assert body["error"]["message"] == "no DFlash checkpoint at /nope: config.json missing"
    assert body["error"]["code"] == "drafter_refused"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"method": "ngram", "num_spec_tokens": 33}, "exceeds MAX_SPEC_TOKENS = 32"),
        ({"method": "ngram", "num_spec_tokens": 0}, "at least 1"),
        ({"method": "ngram", "num_spec_tokens": "4"}, "`num_spec_tokens` must be an integer"),
        ({"method": "eagle", "num_spec_tokens": 4}, "`method` must be one of"),
        ({"method": "dflash", "num_spec_tokens": 4, "draft_model": ""}, "`draft_model` is empty"),
        (
            {"method": "dspark", "num_spec_tokens": 7, "draft_model": "/d", "confidence_threshold": 1.5},
            "`confidence_threshold` must be in [0, 1]",
        ),
        (
            {"method": "dflash", "num_spec_tokens": 7, "draft_model": "/d", "confidence_threshold": 0.3},
            "non-zero only for method dspark",
        ),
        ({"method": "ngram", "num_spec_tokens": 4, "prompt_lookup_min": 5}, "prompt_lookup_min"),
        ({"method": "ngram", "num_spec_tokens": 4, "k": 1}, "unknown field"),
    ],
)
async def test_bad_drafter_requests_never_reach_the_engine(
    frontend: Frontend, peer: EnginePeer, body: dict[str, Any], words: str
) -> None:
    """K=33 (never clamped), K=0, a string K, an unknown method, an empty model path, a confidence threshold
    outside [0, 1] or for another method, bad lookup: 400."""
    status, got = await admin(frontend, "POST", "/admin/engines/0/drafter", body)
    assert status == 400 and words in got["error"]["message"]
    assert peer.drafter_commands == []


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_drafter_body_past_its_bound_is_a_413(
    frontend: Frontend, peer: EnginePeer, chunked: bool
) -> None:
    """A drafter body of one byte more than MAX_BODY_BYTES (64 KiB, a long path's hundredfold): a 413, by its
    Content-Length or, sent chunked, once past the bound; nothing reaches the engine."""
    body = b'{"method": "dflash", "num_spec_tokens": 4, "draft_model": "' + b"d" * MAX_BODY_BYTES + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        url = f"{frontend.url}/admin/engines/0/drafter"
        async with session.post(url, data=chunks() if chunked else body, headers=headers) as response:
            status, got = response.status, await response.json()
    assert status == 413 and got["error"]["code"] == "request_too_large"
    assert f"more than the {MAX_BODY_BYTES} bytes a drafter command can need" in got["error"]["message"]
    assert peer.drafter_commands == []


async def test_unknown_engine_is_404(frontend: Frontend, peer: EnginePeer) -> None:
    """An index no engine has: 404 for load and unload, naming the engines that are up."""
    status, body = await admin(
        frontend, "POST", "/admin/engines/7/drafter", {"method": "ngram", "num_spec_tokens": 2}
    )
    assert status == 404 and body["error"]["message"] == "engine 7 is not connected (engines up: 0)"
    assert (await admin(frontend, "DELETE", "/admin/engines/7/drafter"))[0] == 404


async def test_no_reply_is_504(start_frontend: FrontendFactory, start_peer: PeerFactory) -> None:
    """An engine that never answers: 504 after the drafter timeout."""
    frontend = await start_frontend(drafter_timeout=0.2, admin_api_key=ADMIN_KEY)
    peer = await start_peer(frontend, PeerConfig(ignore_drafter_commands=True))
    status, body = await admin(frontend, "DELETE", "/admin/engines/0/drafter")
    assert status == 504 and "did not answer UnloadDrafter within 0.2 s" in body["error"]["message"]
    assert len(peer.drafter_commands) == 1
    assert frontend.client.registry.get(0).commands == {}  # type: ignore[union-attr]


async def test_restart_before_the_reply_is_503(frontend: Frontend, start_peer: PeerFactory) -> None:
    """An engine that restarts while a drafter command waits: 503 saying so, well before the timeout."""
    peer = await start_peer(frontend, PeerConfig(ignore_drafter_commands=True))
    command = asyncio.create_task(admin(frontend, "DELETE", "/admin/engines/0/drafter"))
    await wait_until(lambda: len(peer.drafter_commands) == 1)
    await peer.restart()
    status, body = await command
    assert status == 503 and "restarted before it answered" in body["error"]["message"]


async def test_admin_routes_need_the_api_key(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """With --api-key: no key or a wrong one is 401 on every admin route; the right key works."""
    frontend = await start_frontend(api_key="sesame")
    peer = await start_peer(frontend)
    load = {"method": "ngram", "num_spec_tokens": 2}
    for key in (None, "wrong"):
        assert (await admin(frontend, "GET", "/admin/engines", key=key))[0] == 401
        assert (await admin(frontend, "POST", "/admin/engines/0/drafter", load, key=key))[0] == 401
        assert (await admin(frontend, "DELETE", "/admin/engines/0/drafter", key=key))[0] == 401
    assert peer.drafter_commands == []
    assert (await admin(frontend, "GET", "/admin/engines", key="sesame"))[0] == 200
    assert (await admin(frontend, "POST", "/admin/engines/0/drafter", load, key="sesame"))[0] == 200


async def test_admin_routes_are_off_without_a_key(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Neither --api-key nor --admin-api-key: every admin route is a 403 saying how to turn them on, with
    any key or none; nothing reaches the engine, and the API itself serves."""
    frontend = await start_frontend()
    peer = await start_peer(frontend)
    load = {"method": "ngram", "num_spec_tokens": 2}
    for key in (None, "anything"):
        for method, path, body in [
            ("GET", "/admin/engines", None),
            ("POST", "/admin/engines/0/drafter", load),
            ("DELETE", "/admin/engines/0/drafter", None),
            ("GET", "/admin/nothing", None),
        ]:
            status, got = await admin(frontend, method, path, body, key=key)
            assert (status, got["error"]["code"], got["error"]["type"]) == (
                403,
                "admin_api_disabled",
                "permission_error",
            )
            assert all(flag in got["error"]["message"] for flag in ("--admin-api-key", "--api-key"))
    assert peer.drafter_commands == []
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{frontend.url}/v1/models") as response:
            assert response.status == 200


async def test_admin_api_key_is_separate_from_the_api_key(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """With both keys, /admin takes only the admin key and /v1 only the API key (least privilege)."""
    frontend = await start_frontend(api_key="user-key", admin_api_key=ADMIN_KEY)
    await start_peer(frontend)
    assert (await admin(frontend, "GET", "/admin/engines", key="user-key"))[0] == 401
    assert (await admin(frontend, "GET", "/admin/engines", key=ADMIN_KEY))[0] == 200
    assert (await admin(frontend, "GET", "/v1/models", key=ADMIN_KEY))[0] == 401
    assert (await admin(frontend, "GET", "/v1/models", key="user-key"))[0] == 200


async def test_a_dspark_load_carries_its_threshold(frontend: Frontend, peer: EnginePeer) -> None:
    body = {"method": "dspark", "num_spec_tokens": 7, "draft_model": "/d", "confidence_threshold": 0.4}
    status, _ = await admin(frontend, "POST", "/admin/engines/0/drafter", body)
    [command] = peer.drafter_commands
    assert status == 200 and isinstance(command, LoadDrafter)
    assert (command.method, command.draft_model, command.confidence_threshold) == ("dspark", "/d", 0.4)
