"""Fuzzing (hypothesis, bounded) every HTTP route on arbitrary bodies and headers, with the frontend of
fuzz_harness: never a 5xx but 503, no counter moves but those of requests that succeeded, nothing is left in
flight, the server still serves. Integers reach past 64 bits, JSON nests past any limit, headers carry
non-ASCII text."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.frontend.fuzz_harness import FUZZ, FUZZ_ADMIN_KEY, Harness

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# Any integer, 64-bit or not: each integer field is bounded where the body is decoded.
_INTEGERS = st.integers() | st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**40])


@st.composite
def _nested(draw: st.DrawFn) -> bytes:
    """A JSON value of arrays nested 100 to 3000 deep (past MAX_NESTING, and past Python's recursion limit)."""
    depth = draw(st.integers(100, 3000))
    return b"[" * depth + b"1" + b"]" * depth


_FIELDS = {
    "model": st.sampled_from(["tiny", "other", ""]) | _JSON,
    "prompt": st.text(max_size=12) | st.lists(st.integers(-3, 400), max_size=5) | _JSON,
    "messages": st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                "content": st.text(max_size=12) | _JSON,
            }
        ),
        max_size=3,
    )
    | _JSON,
    "max_tokens": st.integers(-2, 80) | _INTEGERS | _JSON,
    "stream": st.booleans() | _JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | _JSON}) | _JSON,
    "temperature": st.floats(-1, 3) | _JSON,
    "top_p": st.floats(-1, 2) | _JSON,
    "n": st.integers(-1, 3) | _JSON,
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3) | _JSON,
    "logprobs": st.integers(-1, 30) | st.booleans() | _INTEGERS | _JSON,
    "top_logprobs": st.integers(-1, 30) | _INTEGERS | _JSON,
    "seed": _INTEGERS | _JSON,
    "ignore_eos": st.booleans() | _JSON,
    "method": st.sampled_from(["ngram", "dflash", "x"]) | _JSON,
    "tools": st.lists(
        st.fixed_dictionaries(
            {"type": st.just("function") | _JSON},
            optional={
                "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g h"]) | _JSON}) | _JSON
            },
        ),
        max_size=2,
    )
    | _JSON,
    "tool_choice": st.sampled_from(
        ["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]
    )
    | _JSON,
    "parallel_tool_calls": st.booleans() | _JSON,
    "chat_template_kwargs": st.fixed_dictionaries({}, optional={"enable_thinking": st.booleans()}) | _JSON,
    "num_spec_tokens": st.integers(-1, 40) | _JSON,
    "top_k": st.integers(-2, 400) | _INTEGERS,
    "min_tokens": st.integers(0, 3) | _INTEGERS,
    "max_completion_tokens": st.integers(1, 40) | _INTEGERS,
    "stop_token_ids": st.lists(st.integers(0, 300) | _INTEGERS, max_size=3),
    "logit_bias": st.dictionaries(
        (st.integers(0, 300) | _INTEGERS).map(str), st.floats(-100, 100), max_size=3
    ),
    "allowed_token_ids": st.lists(_INTEGERS, max_size=3),
    "prompt_lookup_min": st.integers(1, 4) | _INTEGERS,
    "prompt_lookup_max": st.integers(1, 8) | _INTEGERS,
}
_BODIES = st.one_of(
    st.binary(max_size=200),
    _nested(),
    _JSON.map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries({}, optional=_FIELDS).map(lambda value: json.dumps(value).encode()),
)
# Valid requests of the routes that take a body, to be fuzzed a few fields at a time.
_VALID = [
    ("POST", "/v1/completions", {"model": "tiny", "prompt": [50, 60], "max_tokens": 3}),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
    (
        "POST",
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": '<think>a</think><tool_call>{"name": "f"'}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "max_tokens": 40,
        },
    ),  # fmt: skip
    ("POST", "/admin/engines/{i}/drafter", {"method": "ngram", "num_spec_tokens": 3}),
]
_HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "X-Request-Id",
            "Authorization",
            "Content-Type",
            "Accept",
            "User-Agent",
            "X-Anything",
            "Origin",
            "Host",
        ]
    ),
    # visible ASCII, and non-ASCII text (sent as UTF-8); control bytes are aiohttp's parser's to refuse
    st.text(
        alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\x7f"), max_size=40
    )
    | st.sampled_from(["application/json", "text/plain", "http://app.example", "localhost:1", "[::1]"]),
    max_size=3,
)
_ROUTES = st.sampled_from(
    [
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/admin/engines/{i}/drafter"),
        ("DELETE", "/admin/engines/{i}/drafter"),
        ("GET", "/health"),
        ("GET", "/metrics"),
        ("GET", "/v1/models"),
        ("GET", "/admin/engines"),
        ("PUT", "/v1/completions"),
        ("GET", "/v1/nothing"),
    ]
)
_GENERATING = ("/v1/completions", "/v1/chat/completions")


@st.composite
def _requests(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """(method, path, body): any route with any body, or a valid request with up to three fields changed."""
    if draw(st.booleans()):
        method, path = draw(_ROUTES)
        body = draw(_BODIES)
    else:
        method, path, valid = draw(st.sampled_from(_VALID))
        fields = dict(valid)
        for name in draw(st.lists(st.sampled_from(sorted(_FIELDS)), max_size=3, unique=True)):
            fields[name] = draw(_FIELDS[name])
        body = json.dumps(fields).encode()
        if draw(st.integers(0, 9)) == 0:  # one field nested too deeply (json.dumps itself would recurse)
            name = draw(st.sampled_from(sorted(_FIELDS)))
            body = body[:-1] + f', "{name}": '.encode() + draw(_nested()) + b"}"
    index = draw(st.sampled_from(["0", "1", "123456789012345678901234567890"]))
    return method, path.replace("{i}", index), body


def test_http_routes_survive_fuzzed_requests(harness: Harness) -> None:
    """Arbitrary bodies and headers on every route: never a 5xx but 503; every counter but those of the
    requests that succeeded stays where it was; the server still serves."""
    before = harness.counters()
    succeeded = {"generations": 0}

    async def request(method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {FUZZ_ADMIN_KEY}", "Content-Type": "application/json", **headers}
        async with harness.session.request(method, harness.url + path, data=body, headers=headers) as r:
            return r.status, await r.read()

    @given(request_parts=_requests(), headers=_HEADERS)
    @settings(FUZZ, max_examples=300)
    def fuzz(request_parts: tuple[str, str, bytes], headers: dict[str, str]) -> None:
        method, path, body = request_parts
        status, content = harness.run(request(method, path, body, headers))
        assert status < 500 or status == 503, (status, content[:300])
        if status >= 400:
            assert "error" in json.loads(content)
        elif method == "POST" and path in _GENERATING:
            succeeded["generations"] += 1

    fuzz()
    assert succeeded["generations"] > 0  # the near-valid bodies reached the engine too
    assert len(harness.client.router) == 0  # every request admitted was released
    after = harness.counters()
    moved = {
        name
        for name, labels in set(before) | set(after)
        if before.get((name, labels), 0.0) != after.get((name, labels), 0.0)
    }
    request_families = (
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:time_to_first_token",
        "vllm:inter_token_latency",
        "vllm:e2e_request_latency",
        "vllm:request_params_n",
    )
    assert all(name.startswith(request_families) for name in moved), moved

    def moved_by(family: str) -> float:
        return sum(v for (name, _), v in after.items() if name == family) - sum(
            v for (name, _), v in before.items() if name == family
        )

    # vLLM's counts: n once per request; each of its n choices is a request to request_success.
    assert moved_by("vllm:request_params_n_count") == succeeded["generations"]
    assert moved_by("vllm:request_success_total") == moved_by("vllm:request_params_n_sum")
    harness.completes()
