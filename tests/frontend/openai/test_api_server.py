"""The HTTP API against engine peers over real sockets: OpenAI shapes, errors, streaming, auth, metrics."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest

from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.openai.http_calls import get, post, stream
from tests.frontend.waits import wait_until

TOKENIZER = tiny_tokenizer.make_tokenizer()
EOS = tiny_tokenizer.EOS_TOKEN_ID


def assert_openai_error(body: Any, error_type: str) -> None:
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == error_type and body["error"]["message"]


async def test_health_is_503_until_an_engine_is_up(frontend: Frontend, start_peer: PeerFactory) -> None:
    """/health answers 503 with no engine, 200 once one has said hello."""
    status, _ = await get(frontend, "/health")
    assert status == 503
    await start_peer(frontend)
    status, _ = await get(frontend, "/health")
    assert status == 200


async def test_models_lists_the_model_named_in_the_hello(fake_frontend: Frontend) -> None:
    """/v1/models is OpenAI's list holding the engine's model name and its max_model_len."""
    status, text = await get(fake_frontend, "/v1/models")
    body = json.loads(text)
    assert status == 200 and body["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [("fake", "model", 2048)]


async def test_completion_has_openai_shape(frontend: Frontend, peer: EnginePeer) -> None:
    """Non-streaming: the peer echoes the prompt, 3 tokens then "length", with usage counts."""
    prompt_ids = TOKENIZER.encode("hello world, the quick brown fox")
    status, body = await post(
        frontend, {"model": "tiny", "prompt": "hello world, the quick brown fox", "max_tokens": 3}
    )
    assert status == 200
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion" and body["model"] == "tiny"
    assert isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice == {"index": 0, "text": TOKENIZER.decode(prompt_ids[:3]), "logprobs": None,
                      "finish_reason": "length", "stop_reason": None}  # fmt: skip
    n = len(prompt_ids)
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": 3, "total_tokens": n + 3,
                             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    assert peer.requests[body["id"]].sampling_params.max_tokens == 3


async def test_eos_and_stop_token_ids_finish_with_stop(frontend: Frontend, peer: EnginePeer) -> None:
    """EOS ends with "stop" (text hidden, token counted); ignore_eos runs on; a stop id is the stop_reason."""
    _, body = await post(frontend, {"prompt": [50, 60, EOS, 70], "max_tokens": 10, "return_token_ids": True})
    choice = body["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"], choice["token_ids"]) == (
        "stop",
        None,
        [50, 60, EOS],
    )
    assert choice["text"] == TOKENIZER.decode([50, 60]) and choice["prompt_token_ids"] == [50, 60, EOS, 70]
    assert body["usage"]["completion_tokens"] == 3

    _, body = await post(frontend, {"prompt": [50, 60, EOS, 70], "max_tokens": 4, "ignore_eos": True})
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 4

    _, body = await post(frontend, {"prompt": [50, 60, 70], "max_tokens": 10, "stop_token_ids": [60]})
    assert (body["choices"][0]["finish_reason"], body["choices"][0]["stop_reason"]) == ("stop", 60)


async def test_max_tokens_within_the_context_is_cut_to_the_room_left(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """A 60-token prompt on a 64-token model with max_tokens 10 gets at most 4 output tokens, then
    "length" (vLLM's get_max_tokens cuts a bound within the context to the room the prompt leaves)."""
    status, body = await post(frontend, {"prompt": [50] * 60, "max_tokens": 10})
    assert status == 200
    assert (body["choices"][0]["finish_reason"], body["usage"]["completion_tokens"]) == ("length", 4)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_max_tokens_past_the_context_is_400(
    frontend: Frontend, peer: EnginePeer, endpoint: str
) -> None:
    """max_tokens above max_model_len (64) is vLLM's 400, in its words, naming the field; none reaches
    the engine."""
    if endpoint == "completions":
        body: dict[str, object] = {"prompt": [50] * 3, "max_tokens": 65}
        path, field = "/v1/completions", "max_tokens"
    else:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 65}
        path, field = "/v1/chat/completions", "max_completion_tokens"
    status, got = await post(frontend, body, path=path)
    assert status == 400 and got["error"]["param"] == field
    assert got["error"]["message"] == (
        f"{field}=65 cannot be greater than max_model_len=64. Please request fewer output tokens."
    )
    assert peer.requests == {}


async def test_streaming_chunks_concatenate_to_the_completion(frontend: Frontend, peer: EnginePeer) -> None:
    """SSE: chunks in OpenAI's format, no U+FFFD mid-character, finish on the last, usage chunk, [DONE]."""
    text = "naïve café 日本語 🙂🚀"
    ids = TOKENIZER.encode(text)
    body = {"prompt": text, "max_tokens": len(ids), "stream_options": {"include_usage": True}}
    events = await stream(frontend, body)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert all(
        c["object"] == "text_completion" and c["id"] == usage["id"] and c["usage"] is None for c in chunks
    )
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == text and all("\ufffd" not in t for t in texts)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids)


async def test_streaming_with_token_ids(frontend: Frontend, peer: EnginePeer) -> None:
    """return_token_ids in a stream: prompt ids on the first chunk, each chunk's new token ids."""
    events = await stream(frontend, {"prompt": [50, 60, 70], "max_tokens": 3, "return_token_ids": True})
    chunks = [e["choices"][0] for e in events[:-1]]
    assert chunks[0]["prompt_token_ids"] == [50, 60, 70]
    assert [c["token_ids"] for c in chunks] == [[50], [60], [70]]


@pytest.mark.parametrize(
    ("body", "status", "error_type"),
    [
        (b"{not json", 400, "invalid_request_error"),
        ({"max_tokens": 5}, 400, "invalid_request_error"),
        ({"prompt": "hi", "max_tokens": 0}, 400, "invalid_request_error"),
        ({"prompt": "hi", "max_tokens": -1}, 400, "invalid_request_error"),
        ({"prompt": [50] * 2048}, 400, "invalid_request_error"),  # the fake engine's 2048 positions
        ({"prompt": "hi", "model": "gpt-4"}, 404, "invalid_request_error"),
    ],
)
async def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    fake_frontend: Frontend, body: object, status: int, error_type: str
) -> None:
    """Bad JSON, no prompt, max_tokens <= 0, a prompt filling the model, an unknown model: error bodies."""
    got_status, got = await post(fake_frontend, body)
    assert got_status == status
    assert_openai_error(got, error_type)
    got_status, _ = await post(fake_frontend, {"prompt": "hi", "max_tokens": 2})
    assert got_status == 200


async def test_too_long_prompt_message_names_the_limit(fake_frontend: Frontend) -> None:
    """The 400 for a prompt that fills the model says the model's length and the prompt's."""
    _, body = await post(fake_frontend, {"prompt": [50] * 2100})
    message = body["error"]["message"]
    assert "maximum context length is 2048 tokens" in message and "2100" in message


async def test_no_engine_is_503(frontend: Frontend) -> None:
    """A completion with no engine up is a 503 OpenAI error."""
    status, body = await post(frontend, {"prompt": "hi"})
    assert status == 503
    assert_openai_error(body, "service_unavailable")


async def test_unknown_route_is_an_openai_404(frontend: Frontend) -> None:
    """Even aiohttp's own 404 has OpenAI's error shape."""
    status, text = await get(frontend, "/v1/nothing")
    assert status == 404
    assert_openai_error(json.loads(text), "invalid_request_error")


async def test_metrics_expose_the_serving_metrics_with_engine_labels(fake_frontend: Frontend) -> None:
    """/metrics carries every docs/design.md serving metric, labelled with model_name and engine="0"."""
    await post(fake_frontend, {"prompt": [50, 60, 70], "max_tokens": 3, "ignore_eos": True})
    status, text = await get(fake_frontend, "/metrics")
    assert status == 200
    for series in [
        'vllm:num_requests_running{engine="0",model_name="fake"}',
        'vllm:num_requests_waiting{engine="0",model_name="fake"}',
        'vllm:kv_cache_usage_perc{engine="0",model_name="fake"}',
        'vllm:prompt_tokens_total{engine="0",model_name="fake"} 3.0',
        'vllm:generation_tokens_total{engine="0",model_name="fake"} 3.0',
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="fake"} 1.0',
        'vllm:time_to_first_token_seconds_count{model_name="fake"} 1.0',
        'vllm:inter_token_latency_seconds_count{model_name="fake"} 2.0',  # 3 outputs, 2 gaps
        'vllm:e2e_request_latency_seconds_count{model_name="fake"} 1.0',
        'openinfer:engine_up{engine="0"} 1.0',
    ]:
        assert series in text, series
    assert "# TYPE openinfer:protocol_errors_total counter" in text


async def test_api_key_is_required_except_on_health_and_metrics(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """With --api-key: no or wrong Bearer key is 401; /health and /metrics stay open; the right key works."""
    frontend = await start_frontend(api_key="sesame")
    await start_peer(frontend)
    for headers in [None, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}]:
        status, body = await post(frontend, {"prompt": "hi"}, headers=headers)
        assert status == 401
        assert_openai_error(body, "invalid_request_error")
        assert (await get(frontend, "/v1/models", headers=headers))[0] == 401
    assert (await get(frontend, "/health"))[0] == 200
    assert (await get(frontend, "/metrics"))[0] == 200
    status, _ = await post(frontend, {"prompt": "hi"}, headers={"Authorization": "Bearer sesame"})
    assert status == 200


async def test_client_disconnect_mid_stream_aborts_on_the_engine(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """A streaming client that goes away makes the engine receive AbortRequests for its request."""
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    async with aiohttp.ClientSession() as session:
        body = {"prompt": "hello world", "max_tokens": 50, "stream": True}
        async with session.post(f"{frontend.url}/v1/completions", json=body) as response:
            await response.content.readuntil(b"\n\n")  # the first chunk: the request is running
            response.close()
    [request_id] = peer.requests
    await wait_until(lambda: request_id in peer.aborted)
    await wait_until(lambda: frontend.client.router.on_engine(frontend.client.registry.get(0)) == {})  # type: ignore[arg-type]


async def test_client_disconnect_while_waiting_aborts_on_the_engine(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """A non-streaming client that times out makes the engine receive AbortRequests too."""
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                f"{frontend.url}/v1/completions", json={"prompt": "hello world", "max_tokens": 50}
            )
    await wait_until(lambda: len(peer.requests) == 1 and list(peer.requests) == peer.aborted)


async def test_engine_error_is_500_with_its_message(frontend: Frontend, start_peer: PeerFactory) -> None:
    """An engine's error finish is a 500 carrying the engine's message; streaming: an error event, [DONE]."""
    await start_peer(frontend, PeerConfig(fail_with="CUDA out of memory"))
    status, body = await post(frontend, {"prompt": "hello world", "max_tokens": 5})
    assert status == 500
    assert_openai_error(body, "server_error")
    assert body["error"]["message"] == "CUDA out of memory"

    events = await stream(frontend, {"prompt": "hello world", "max_tokens": 5})
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["message"] == "CUDA out of memory"


async def test_engine_refusal_is_400_with_its_message(frontend: Frontend, start_peer: PeerFactory) -> None:
    """An engine's error finish marked bad_request (the client's fault, e.g. a grammar that does not
    compile) is a 400 invalid_request_error carrying its message; streaming: that error's event, [DONE]."""
    refusal = "the regex does not compile: Unclosed '['"
    await start_peer(frontend, PeerConfig(refuse_with=refusal))
    status, body = await post(frontend, {"prompt": "hello world", "max_tokens": 5})
    assert status == 400
    assert_openai_error(body, "invalid_request_error")
    assert body["error"]["message"] == refusal

    events = await stream(frontend, {"prompt": "hello world", "max_tokens": 5})
    assert events[-1] == "[DONE]"
    assert events[-2]["error"] == {
        "message": refusal,
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


@pytest.mark.parametrize("refused", [False, True], ids=["failed", "refused"])
async def test_an_engines_message_cannot_forge_log_lines(
    frontend: Frontend, start_peer: PeerFactory, caplog: pytest.LogCaptureFixture, refused: bool
) -> None:
    """An engine's error message with newlines in it (it may quote the request's text) is logged on one line,
    as its repr; the client still gets it as it is."""
    message = "bad\n2026-01-01 00:00:00 INFO forged: a line the engine never wrote"
    await start_peer(frontend, PeerConfig(refuse_with=message) if refused else PeerConfig(fail_with=message))
    caplog.set_level(logging.INFO)
    status, body = await post(frontend, {"prompt": "hello world", "max_tokens": 5})
    assert status == (400 if refused else 500) and body["error"]["message"] == message
    [logged] = [
        r.getMessage()
        for r in caplog.records
        if "by its engine" in r.getMessage() or "on its engine" in r.getMessage()
    ]
    assert "\n" not in logged and logged.endswith(f": {message!r}")


async def test_silent_engine_is_marked_down_and_its_request_fails(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """An engine silent past --engine-timeout: its request is a 500 naming it, engine_up 0, /health 503."""
    frontend = await start_frontend(engine_timeout=0.5)
    await start_peer(frontend, PeerConfig(silent_on_request=True))
    status, body = await post(frontend, {"prompt": "hello", "max_tokens": 5})
    assert status == 500
    assert "engine 0" in body["error"]["message"] and "stopped responding" in body["error"]["message"]
    _, text = await get(frontend, "/metrics")
    assert 'openinfer:engine_up{engine="0"} 0.0' in text
    assert 'vllm:num_requests_running{engine="0"' not in text  # a dead engine's load is not summed
    assert (await get(frontend, "/health"))[0] == 503
