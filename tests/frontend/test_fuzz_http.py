"""Fuzzing (hypothesis, bounded) every HTTP route on arbitrary bodies and headers, with the frontend of
test_fuzz: never a 5xx but 503, no counter moves but those of requests that succeeded, the server still serves."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.frontend.test_fuzz import FUZZ, FUZZ_ADMIN_KEY, Harness, harness  # noqa: F401 - harness is the fixture

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
    "max_tokens": st.integers(-2, 80) | st.integers() | _JSON,
    "stream": st.booleans() | _JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | _JSON}) | _JSON,
    "temperature": st.floats(-1, 3) | _JSON,
    "top_p": st.floats(-1, 2) | _JSON,
    "n": st.integers(-1, 3) | _JSON,
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3) | _JSON,
    "logprobs": st.integers(-1, 30) | st.booleans() | _JSON,
    "top_logprobs": st.integers(-1, 30) | _JSON,
    "seed": st.integers() | _JSON,
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
}
_BODIES = st.one_of(
    st.binary(max_size=200),
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
    st.sampled_from(["X-Request-Id", "Authorization", "Content-Type", "Accept", "User-Agent", "X-Anything"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
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
    index = draw(st.sampled_from(["0", "1", "123456789012345678901234567890"]))
    return method, path.replace("{i}", index), body


def test_http_routes_survive_fuzzed_requests(harness: Harness) -> None:  # noqa: F811 - the fixture
    """Arbitrary bodies and headers on every route: never a 5xx but 503; every counter but those of the
    requests that succeeded stays where it was; the server still serves."""
    before = harness.counters()
    succeeded = {"generations": 0}

    async def request(method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {FUZZ_ADMIN_KEY}", **headers}
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
    )
    assert all(name.startswith(request_families) for name in moved), moved
    successes = sum(v for (name, _), v in after.items() if name == "vllm:request_success_total") - sum(
        v for (name, _), v in before.items() if name == "vllm:request_success_total"
    )
    assert successes == succeeded["generations"]
    harness.completes()
