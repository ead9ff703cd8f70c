"""``n`` choices through the HTTP API over real sockets: each choice is an engine request of its own (vLLM's
child ids and seeds), merged into one response or stream, validated, counted and aborted together."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from openinfer.frontend.metrics.spec_decode.per_request import PerRequestSpecMetrics
from openinfer.frontend.openai.choices import Choices
from openinfer.frontend.openai.completion_request import parse_completion_request
from openinfer.frontend.openai.response_format import ResponseIds
from openinfer.protocol import SpecDecodeCounters
from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, PeerFactory
from tests.frontend.openai.http_calls import MESSAGES, chat, chat_stream, get, post, stream
from tests.frontend.waits import wait_until

TOKENIZER = tiny_tokenizer.make_tokenizer()
PROMPT = "hello world, the quick brown fox"
PROMPT_IDS = TOKENIZER.encode(PROMPT)


def two_drafts() -> SpecDecodeCounters:
    """A request's stats after two rounds of K=3: 2 and 1 drafts accepted."""
    stats = SpecDecodeCounters.zero(3)
    stats.observe_draft(3, 2)
    stats.observe_draft(3, 1)
    return stats


def by_index(chunks: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Each choice's stream chunks, in order; every chunk but the usage chunk holds exactly one choice."""
    choices: dict[int, list[dict[str, Any]]] = {}
    for chunk in chunks:
        [choice] = chunk["choices"]
        choices.setdefault(choice["index"], []).append(choice)
    return choices


async def test_whole_completion_holds_n_choices_each_its_own_engine_request(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """n=3: choices indexed 0..2, each with its own text, token ids and logprobs (text offsets from 0); usage
    counts the prompt once and every choice's tokens; the engine got vLLM's children "i_ID" seeded seed + i."""
    body = {"prompt": PROMPT, "max_tokens": 4, "n": 3, "seed": 10, "logprobs": 1, "return_token_ids": True}
    status, answer = await post(frontend, body)
    assert status == 200, answer
    assert [choice["index"] for choice in answer["choices"]] == [0, 1, 2]
    for choice in answer["choices"]:
        assert choice["text"] == TOKENIZER.decode(PROMPT_IDS[:4]) and choice["finish_reason"] == "length"
        assert choice["token_ids"] == PROMPT_IDS[:4] and choice["prompt_token_ids"] == PROMPT_IDS
        assert choice["logprobs"]["text_offset"][0] == 0 and len(choice["logprobs"]["tokens"]) == 4
    n = len(PROMPT_IDS)
    assert answer["usage"] == {"prompt_tokens": n, "completion_tokens": 12, "total_tokens": n + 12,
                               "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    seeds = {request_id: r.sampling_params.seed for request_id, r in peer.requests.items()}
    assert seeds == {f"{i}_{answer['id']}": 10 + i for i in range(3)}


async def test_choices_go_to_the_engine_that_cached_the_prompt(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """n=4 over two idle engines: every child goes where choice 0 went (its prompt's blocks are cached
    there), though the least-loaded engine, the other one, would take each while choice 0 runs."""
    slow = 0.05  # seconds per token: choice 0 still runs when the others are sent
    peers = [await start_peer(frontend, PeerConfig(engine_index=i, token_delay_s=slow)) for i in range(2)]
    status, answer = await post(frontend, {"prompt": PROMPT, "max_tokens": 4, "n": 4, "seed": 1})
    assert status == 200, answer
    children = {f"{i}_{answer['id']}" for i in range(4)}
    assert [set(peer.requests) for peer in peers] in ([children, set()], [set(), children])


async def test_without_a_seed_children_sample_unseeded(frontend: Frontend, peer: EnginePeer) -> None:
    """n=2 without a seed: both children are sent with none (each draws from the engine's generator)."""
    status, answer = await post(frontend, {"prompt": PROMPT, "max_tokens": 2, "n": 2})
    assert status == 200 and len(answer["choices"]) == 2
    assert {i: r.sampling_params.seed for i, r in peer.requests.items()} == {
        f"0_{answer['id']}": None,
        f"1_{answer['id']}": None,
    }


async def test_streamed_completion_finishes_each_choice_and_sums_usage(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """Streamed n=3: every chunk holds one choice with its index; each choice's text is its whole completion
    and it finishes in exactly one chunk, its last; the usage chunk comes last and sums the choices."""
    body = {"prompt": PROMPT, "max_tokens": 5, "n": 3, "stream_options": {"include_usage": True}}
    events = await stream(frontend, body)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 15
    assert usage["usage"]["prompt_tokens"] == len(PROMPT_IDS)
    assert all(chunk["usage"] is None and chunk["id"] == usage["id"] for chunk in chunks)
    choices = by_index(chunks)
    assert sorted(choices) == [0, 1, 2]
    for pieces in choices.values():
        assert "".join(piece["text"] for piece in pieces) == TOKENIZER.decode(PROMPT_IDS[:5])
        assert [piece["finish_reason"] for piece in pieces][-1] == "length"
        assert sum(piece["finish_reason"] is not None for piece in pieces) == 1


async def test_chat_holds_n_messages_whole_and_streamed(frontend: Frontend, peer: EnginePeer) -> None:
    """Chat n=2: two assistant messages indexed 0 and 1; streamed, each choice opens with its role chunk,
    its content is the whole message's, and it finishes once; usage sums both."""
    body = {"messages": MESSAGES, "max_completion_tokens": 3, "n": 2}
    status, answer = await chat(frontend, body)
    assert status == 200, answer
    assert [(c["index"], c["message"]["role"], c["finish_reason"]) for c in answer["choices"]] == [
        (0, "assistant", "length"),
        (1, "assistant", "length"),
    ]
    content = answer["choices"][0]["message"]["content"]
    assert content and answer["choices"][1]["message"]["content"] == content
    assert answer["usage"]["completion_tokens"] == 6

    events = await chat_stream(frontend, {**body, "stream_options": {"include_usage": True}})
    *chunks, usage, done = events
    assert done == "[DONE]" and usage["usage"]["completion_tokens"] == 6
    choices = by_index(chunks)
    assert sorted(choices) == [0, 1]
    for pieces in choices.values():
        assert pieces[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(piece["delta"].get("content", "") for piece in pieces) == content
        assert [piece["finish_reason"] for piece in pieces][-1] == "length"
        assert sum(piece["finish_reason"] is not None for piece in pieces) == 1


async def test_spec_metrics_go_in_each_choice(frontend: Frontend, start_peer: PeerFactory) -> None:
    """With n > 1 each choice carries its own spec-decode "metrics" (streamed: on its finishing choice) and
    the body none; with n = 1 the body carries them, as vLLM's."""
    await start_peer(frontend, PeerConfig(spec_stats=two_drafts()))
    _, whole = await post(frontend, {"prompt": PROMPT, "max_tokens": 3, "n": 2})
    assert "metrics" not in whole
    assert [c["metrics"]["speculative_decoding"]["num_spec_steps"] for c in whole["choices"]] == [2, 2]

    events = await stream(frontend, {"prompt": PROMPT, "max_tokens": 3, "n": 2})
    finishing = [chunk for chunk in events[:-1] if chunk["choices"][0]["finish_reason"] is not None]
    assert len(finishing) == 2 and all("metrics" not in chunk for chunk in events[:-1])
    assert all(chunk["choices"][0]["metrics"]["speculative_decoding"] for chunk in finishing)

    _, single = await post(frontend, {"prompt": PROMPT, "max_tokens": 3})
    assert single["metrics"]["speculative_decoding"]["num_spec_steps"] == 2
    assert "metrics" not in single["choices"][0]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_client_disconnect_aborts_every_choice(
    frontend: Frontend, start_peer: PeerFactory, streamed: bool
) -> None:
    """A client that goes away (closing its stream, or timing out on a whole response) makes the engine
    receive an abort for each of the n children, and none stays in flight."""
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    body = {"prompt": PROMPT, "max_tokens": 50, "n": 3, "stream": streamed}
    timeout = aiohttp.ClientTimeout(total=None if streamed else 1.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        if streamed:
            async with session.post(f"{frontend.url}/v1/completions", json=body) as response:
                await response.content.readuntil(b"\n\n")  # the first chunk: every child was sent
                response.close()
        else:
            with pytest.raises(asyncio.TimeoutError):
                await session.post(f"{frontend.url}/v1/completions", json=body)
    await wait_until(lambda: len(peer.requests) == 3 and sorted(peer.aborted) == sorted(peer.requests))
    assert len(frontend.client.router) == 0


async def test_leaving_aborts_every_choice_though_cancelled_as_it_leaves(
    frontend: Frontend, start_peer: PeerFactory
) -> None:
    """A stream whose client reset the connection: the write raises, and aiohttp cancels the handler once the
    loop sees the connection lost, i.e. at leaving's first await. Every child is still aborted on the engine
    and leaves the router (issue 39: a cancelled wait for the pumps skipped the aborts, and all n ran on)."""
    peer = await start_peer(frontend, PeerConfig(token_delay_s=0.05))
    model = frontend.client.served_model("tiny")
    assert model is not None
    body = json.dumps({"prompt": PROMPT, "max_tokens": 50, "n": 3, "stream": True}).encode()
    parsed = parse_completion_request(body)
    ids = ResponseIds("cmpl-cut", int(time.time()), model.name)
    choices = Choices(
        frontend.client,
        frontend.metrics,
        model,
        parsed.prepare(model, "cut"),
        parsed.options,
        time.monotonic(),
        ids,
        PerRequestSpecMetrics.OFF,
    )

    async def handler() -> None:
        async with choices:
            async for _ in choices.chunks():
                asyncio.get_running_loop().call_soon(task.cancel)  # aiohttp's connection_lost, queued
                raise ConnectionResetError("Cannot write to closing transport")  # the failed write

    task = asyncio.create_task(handler())
    with pytest.raises(asyncio.CancelledError):  # the cancellation landed while the choices were left
        await task
    # All three were sent before the first chunk (entering the choices sends them); the peer reads them on
    # its own time, the aborts after them (one socket, in order).
    sent = [f"{i}_cut" for i in range(3)]
    await wait_until(lambda: sorted(peer.requests) == sent and sorted(peer.aborted) == sent)
    assert len(frontend.client.router) == 0


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_one_failing_choice_fails_the_request_and_aborts_the_others(
    frontend: Frontend, start_peer: PeerFactory, streamed: bool
) -> None:
    """Choice 1's engine error ends the request with its message (a 500, or the stream's error event before
    [DONE]), and every other child sent is aborted on the engine at once: choice 0, and choice 2 when it was
    sent before choice 1 failed (after that no child is sent, so whether it was is a matter of timing)."""
    peer = await start_peer(
        frontend, PeerConfig(token_delay_s=0.05, fail_with="CUDA error", fail_prefix="1_")
    )
    body = {"prompt": PROMPT, "max_tokens": 50, "n": 3}
    if streamed:
        events = await stream(frontend, body)
        assert events[-1] == "[DONE]" and events[-2]["error"]["message"] == "CUDA error"
    else:
        status, answer = await post(frontend, body)
        assert (status, answer["error"]["message"], answer["error"]["type"]) == (
            500,
            "CUDA error",
            "server_error",
        )

    def others_aborted() -> bool:
        others = sorted(request_id for request_id in peer.requests if not request_id.startswith("1_"))
        return any(r.startswith("0_") for r in others) and sorted(peer.aborted) == others

    await wait_until(others_aborted)
    assert len(frontend.client.router) == 0


MAX_SEED = 2**63 - 1
BAD_N = [
    ({"n": 0}, "n", "`n` must be in [1, 128], got 0"),
    ({"n": 129}, "n", "`n` must be in [1, 128], got 129"),
    ({"n": "2"}, "n", "`n` must be an integer"),
    ({"n": True}, "n", "`n` must be an integer"),
    ({"n": 2, "temperature": 0}, "n", "`n` must be 1 when using greedy sampling"),
    ({"n": 3, "seed": MAX_SEED - 1}, "seed", f"`seed` must be at most {MAX_SEED - 2} with `n` = 3"),
    ({"n": 2, "best_of": 2}, "best_of", "`best_of` is not supported"),
    ({"use_beam_search": True}, "use_beam_search", "beam search is not supported"),
]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(("fields", "param", "words"), BAD_N, ids=[str(f) for f, _, _ in BAD_N])
async def test_bad_n_is_an_openai_400_before_any_engine_request(
    frontend: Frontend, peer: EnginePeer, path: str, fields: dict[str, Any], param: str, words: str
) -> None:
    """n outside [1, 128], not an integer, above 1 with greedy sampling (vLLM's rule), a seed whose children
    overflow 64 bits, best_of and beam search: an OpenAI 400 naming the field; nothing reaches the engine."""
    prompt = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": MESSAGES}
    status, answer = await post(frontend, {**prompt, **fields}, path=path)
    assert (status, answer["error"]["type"], answer["error"]["param"]) == (
        400,
        "invalid_request_error",
        param,
    )
    assert words in answer["error"]["message"]
    assert peer.requests == {}


async def test_metrics_count_each_choice_as_a_request_and_n_once(fake_frontend: Frontend) -> None:
    """As vLLM counts them: each choice is a request to request_success and prompt_tokens (n=3: 3 requests of
    3 prompt tokens each), and vllm:request_params_n observes n once per HTTP request."""
    for n in (3, 1):
        status, _ = await post(
            fake_frontend, {"prompt": [50, 60, 70], "max_tokens": 2, "ignore_eos": True, "n": n}
        )
        assert status == 200
    _, text = await get(fake_frontend, "/metrics")
    for series in [
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="fake"} 4.0',
        'vllm:prompt_tokens_total{engine="0",model_name="fake"} 12.0',
        'vllm:generation_tokens_total{engine="0",model_name="fake"} 8.0',
        'vllm:request_params_n_count{model_name="fake"} 2.0',
        'vllm:request_params_n_sum{model_name="fake"} 4.0',
        'vllm:request_params_n_bucket{le="2.0",model_name="fake"} 1.0',
        'vllm:request_params_n_bucket{le="5.0",model_name="fake"} 2.0',
    ]:
        assert series in text, series
