"""Every integer field of /v1/completions, /v1/chat/completions and the admin drafter route is bounded where
the body is decoded: a value of 2**64 or -2**63 - 1 is a 400 naming its field, over a real HTTP server, and
never reaches the engine (whose wire format holds 64-bit integers only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.frontend.engine_peer import EnginePeer
from tests.frontend.frontends import Frontend, FrontendFactory

ADMIN_KEY = "admin"
PAST_UINT64 = 2**64  # msgpack's largest is 2**64 - 1: the encoder raised OverflowError after admission
BELOW_INT64 = -(2**63) - 1
MESSAGES = [{"role": "user", "content": "hi"}]

# (field, how a body holds the integer); each body is otherwise valid
Place = Callable[[int], Any]
COMPLETION_FIELDS: list[tuple[str, Place]] = [
    ("max_tokens", lambda n: n),
    ("logprobs", lambda n: n),
    ("top_k", lambda n: n),
    ("seed", lambda n: n),
    ("min_tokens", lambda n: n),
    ("stop_token_ids", lambda n: [1, n]),
    ("logit_bias", lambda n: {str(n): 1.0}),
    ("allowed_token_ids", lambda n: [n]),
    ("n", lambda n: n),
    ("best_of", lambda n: n),
    ("prompt_logprobs", lambda n: n),
]
CHAT_FIELDS: list[tuple[str, Place]] = [
    ("max_tokens", lambda n: n),
    ("max_completion_tokens", lambda n: n),
    ("top_logprobs", lambda n: n),
    ("top_k", lambda n: n),
    ("seed", lambda n: n),
    ("min_tokens", lambda n: n),
    ("stop_token_ids", lambda n: [n]),
    ("logit_bias", lambda n: {str(n): -5.0}),
    ("allowed_token_ids", lambda n: [n]),
    ("n", lambda n: n),
    ("best_of", lambda n: n),
]
PROMPTS: list[Place] = [lambda n: [5, n], lambda n: [[n, 5]]]  # token ids, and a batch of one
ADMIN_FIELDS = ["num_spec_tokens", "prompt_lookup_min", "prompt_lookup_max"]


async def post(frontend: Frontend, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{frontend.url}{path}", json=body, headers=headers) as response:
            return response.status, await response.json()


@pytest.fixture
async def frontend(start_frontend: FrontendFactory) -> Frontend:
    """A frontend whose admin routes are on, and whose engines take at most one request each."""
    return await start_frontend(admin_api_key=ADMIN_KEY, max_queued_per_engine=1)


def assert_refused(
    status: int, body: dict[str, Any], field: str, peer: EnginePeer, frontend: Frontend
) -> None:
    assert (status, body["error"]["type"], body["error"]["param"]) == (400, "invalid_request_error", field)
    assert peer.requests == {} and peer.drafter_commands == []
    assert len(frontend.client.router) == 0


@pytest.mark.parametrize("value", [PAST_UINT64, BELOW_INT64])
@pytest.mark.parametrize(("field", "place"), COMPLETION_FIELDS, ids=[f for f, _ in COMPLETION_FIELDS])
async def test_completion_integers_past_64_bits_are_400_naming_the_field(
    frontend: Frontend, peer: EnginePeer, field: str, place: Place, value: int
) -> None:
    """/v1/completions: an integer past 64 bits in any field is a 400 naming it; nothing reaches the engine."""
    status, body = await post(
        frontend, "/v1/completions", {"prompt": "hi", "max_tokens": 2, field: place(value)}
    )
    assert_refused(status, body, field, peer, frontend)


@pytest.mark.parametrize("value", [PAST_UINT64, BELOW_INT64])
@pytest.mark.parametrize("place", PROMPTS, ids=["ids", "batch-of-one"])
async def test_prompt_token_ids_past_64_bits_are_400_naming_the_prompt(
    frontend: Frontend, peer: EnginePeer, place: Place, value: int
) -> None:
    """A token id past 64 bits in a prompt is a 400 naming `prompt`; nothing reaches the engine."""
    status, body = await post(frontend, "/v1/completions", {"prompt": place(value), "max_tokens": 2})
    assert_refused(status, body, "prompt", peer, frontend)


@pytest.mark.parametrize("value", [PAST_UINT64, BELOW_INT64])
@pytest.mark.parametrize(("field", "place"), CHAT_FIELDS, ids=[f for f, _ in CHAT_FIELDS])
async def test_chat_integers_past_64_bits_are_400_naming_the_field(
    frontend: Frontend, peer: EnginePeer, field: str, place: Place, value: int
) -> None:
    """/v1/chat/completions: an integer past 64 bits in any field is a 400 naming it (top_logprobs with
    logprobs on); nothing reaches the engine."""
    request = {"messages": MESSAGES, "max_tokens": 2, "logprobs": True, field: place(value)}
    status, body = await post(frontend, "/v1/chat/completions", request)
    assert_refused(status, body, field, peer, frontend)


@pytest.mark.parametrize("value", [PAST_UINT64, BELOW_INT64])
@pytest.mark.parametrize("field", ADMIN_FIELDS)
async def test_drafter_integers_past_64_bits_are_400_naming_the_field(
    frontend: Frontend, peer: EnginePeer, field: str, value: int
) -> None:
    """POST /admin/engines/0/drafter: an integer past 64 bits is a 400 naming its field; no command is sent."""
    request = {"method": "ngram", "num_spec_tokens": 3, field: value}
    status, body = await post(frontend, "/admin/engines/0/drafter", request)
    assert_refused(status, body, field, peer, frontend)


async def test_the_64_bit_bounds_are_inclusive(frontend: Frontend, peer: EnginePeer) -> None:
    """2**63 - 1 and -2**63 themselves are integers of the wire: the seed takes both (vLLM's range)."""
    for seed in (2**63 - 1, -(2**63)):
        status, body = await post(
            frontend, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "seed": seed}
        )
        assert status == 200, body
    assert [r.sampling_params.seed for r in peer.requests.values()] == [2**63 - 1, -(2**63)]


async def test_the_reported_request_leaves_nothing_behind(frontend: Frontend, peer: EnginePeer) -> None:
    """The issue's request, three times over an engine that takes one request: 400 naming top_k each time
    (it was a 500 that stayed in the router), and then a completion is served."""
    bad = {"prompt": "ROMEO:", "max_tokens": 2, "top_k": 18446744073709551616}
    for _ in range(3):
        status, body = await post(frontend, "/v1/completions", bad)
        assert (status, body["error"]["param"]) == (400, "top_k")
    status, body = await post(frontend, "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    assert len(frontend.client.router) == 0
