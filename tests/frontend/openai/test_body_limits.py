"""Request bodies are bounded by what the served models can take before they are decoded: a body past the
largest valid request is a 413 before it is read, a number field past its largest valid value a 400 naming
it; the largest valid ones are served."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from openinfer.frontend.engines.registry import ServedModel
from openinfer.frontend.openai.body.census import INLINE_BYTES, BodyCensus, take_census
from openinfer.frontend.openai.body.limits import BodyLimits
from tests.frontend import tiny_tokenizer
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory

TOKENIZER = tiny_tokenizer.make_tokenizer()  # longest token: 13 characters
# The peer's model: 64 positions, 300 vocabulary rows (ids of at most 3 digits)
TINY = ServedModel("tiny", TOKENIZER, max_model_len=64, vocab_size=300, eos_token_ids=(0,))
TINY_LIMITS = BodyLimits.for_model(TINY)
JSON_HEADERS = {"Content-Type": "application/json"}
_WAIT_S = 30.0  # the bound on any one answer


def test_the_bounds_count_the_most_verbose_valid_json() -> None:
    """Each bound is the JSON its largest valid value takes, written as verbosely as JSON allows."""
    # an id: 3 digits, a comma and 16 bytes of indentation = 20; 64 of them in [[ ]] with 4 x 16 around
    assert TINY_LIMITS.prompt_token_ids == 64 * 20 + 64
    # 300 entries (the vocabulary; fewer than vLLM's 1024) of an id in quotes, a colon and a 24-char number
    assert TINY_LIMITS.logit_bias == 300 * (20 + 3 + 24) + 32
    assert TINY_LIMITS.stop_token_ids == 300 * 20 + 32
    text = 64 * 13 * 6 + 2  # 64 tokens of 13 bytes, each escaped as \u0001, quoted
    bad_words = 1024 * (13 * 6 + 3 + 16)  # 1024 one-token words, escaped, quoted, comma, indented
    assert TINY_LIMITS.body == text + TINY_LIMITS.logit_bias + TINY_LIMITS.stop_token_ids + bad_words + 262144


def test_several_models_take_the_largest_of_each_bound() -> None:
    """With two models served, a body may be as large as the larger model's bound, field by field."""
    long_context = ServedModel("long", TOKENIZER, max_model_len=4096, vocab_size=100, eos_token_ids=(0,))
    both = BodyLimits.for_models([TINY, long_context])
    assert both.prompt_token_ids == BodyLimits.for_model(long_context).prompt_token_ids
    assert both.logit_bias == TINY_LIMITS.logit_bias and both.vocab_size == 300
    assert both.body == max(TINY_LIMITS.body, BodyLimits.for_model(long_context).body)


async def post_bytes(frontend: Frontend, data: bytes | AsyncIterator[bytes]) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_WAIT_S)) as session:
        async with session.post(f"{frontend.url}/v1/completions", data=data, headers=JSON_HEADERS) as r:
            return r.status, await r.json()


def pretty(body: dict[str, Any]) -> bytes:
    """The body as pretty-printers write it: one value per line, indented."""
    return json.dumps(body, indent=4).encode()


async def test_the_largest_valid_number_fields_are_served(frontend: Frontend, peer: EnginePeer) -> None:
    """63 token ids of 3 digits (64 positions, one left for the output), a logit_bias on every one of the 300
    ids with the longest numbers, every id as a stop token: all pretty-printed, and served."""
    body = {
        "prompt": [299] * 63,
        "max_tokens": 1,
        "logit_bias": {str(i): -2.2250738585072014e-308 for i in range(300)},
        "stop_token_ids": list(range(300)),
    }
    status, got = await post_bytes(frontend, pretty(body))
    assert status == 200, got
    assert len(pretty({"prompt": body["prompt"]})) <= TINY_LIMITS.prompt_token_ids


def compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("prompt", [299] * 400, "your prompt of token ids is {size} bytes of JSON, more than 1344 bytes"),
        ("logit_bias", {str(i): 1.0 for i in range(2000)}, "`logit_bias` is {size} bytes of JSON, more than 14132"),
        ("stop_token_ids", list(range(2000)), "`stop_token_ids` is {size} bytes of JSON, more than 6032 bytes"),
    ],
)  # fmt: skip
async def test_a_number_field_past_its_largest_valid_value_is_a_400_before_decoding(
    frontend: Frontend, peer: EnginePeer, field: str, value: object, words: str
) -> None:
    """A field longer than the JSON of its largest valid value is refused by its size, naming the field (the
    decoded checks would count tokens or entries instead); nothing reaches the engine."""
    status, got = await post_bytes(frontend, compact({"prompt": "hi", "max_tokens": 1, field: value}))
    assert status == 400 and got["error"]["param"] == field
    assert words.format(size=len(compact(value))) in got["error"]["message"], got["error"]["message"]
    assert peer.requests == {}


async def test_a_text_prompt_in_a_list_is_bounded_as_text(frontend: Frontend, peer: EnginePeer) -> None:
    """["...2000 characters..."] is text, not token ids: past the token-id bound in bytes, it is refused by
    the character rule after decoding (vLLM's words), not by its size."""
    status, got = await post_bytes(frontend, json.dumps({"prompt": ["a" * 2000], "max_tokens": 1}).encode())
    assert status == 400 and "(more than 832 characters" in got["error"]["message"]


async def send_head(frontend: Frontend, head: str) -> bytes:
    """Send a request head (no body) on a new connection; the status line and headers of the answer."""
    url = urlsplit(frontend.url)
    assert url.hostname is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(head.format(host=url.netloc).encode())
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _WAIT_S)
    finally:
        writer.close()


_HEAD = (
    "POST /v1/completions HTTP/1.1\r\nHost: {{host}}\r\nContent-Type: application/json\r\n"
    "Content-Length: {length}\r\n\r\n"
)


async def test_a_body_past_the_largest_valid_request_is_a_413_before_it_is_read(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """A Content-Length one byte past the bound is answered 413 with only the head sent: the body is never
    waited for, let alone decoded; a chunked body past it is a 413 too."""
    head = await send_head(frontend, _HEAD.format(length=TINY_LIMITS.body + 1))
    assert head.startswith(b"HTTP/1.1 413 ")

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(TINY_LIMITS.body // 65536 + 1):
            yield b"a" * 65536
        yield b'"}'

    status, got = await post_bytes(frontend, chunks())
    assert status == 413 and got["error"]["code"] == "request_too_large"
    assert f"more than the {TINY_LIMITS.body} bytes the largest valid request" in got["error"]["message"]


async def test_no_engine_is_a_503_before_the_body_is_read(frontend: Frontend) -> None:
    """With no model served no body is valid: 503 at once, whatever the body's size."""
    head = await send_head(frontend, _HEAD.format(length=10**9))
    assert head.startswith(b"HTTP/1.1 503 ")


def test_the_census_sizes_number_fields_and_counts_commas_outside_strings() -> None:
    """A census holds each number field's JSON bytes (none for a text prompt) and the commas between values,
    not those in strings (escaped quotes included); a body that is not JSON is said so."""
    body = b'{"prompt": [1, 22], "logit_bias": {"5": 1}, "stop": ["x,y", "\\",\\""], "stop_token_ids": []}'
    # commas: 1 in the prompt, 3 between fields, 1 between the stop strings (2 more are in them)
    assert take_census(body) == BodyCensus(
        prompt_bytes=7, logit_bias_bytes=8, stop_token_ids_bytes=2, commas=5
    )
    assert take_census(b'{"prompt": "a, b"}') == BodyCensus(commas=0)
    assert take_census(b'{"prompt": ["a", "b"]}') == BodyCensus(commas=1)  # a batch of texts is text
    assert take_census(b'{"prompt": [1,').not_json is not None


async def test_a_body_of_more_values_than_a_request_can_need_is_a_400(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """70,000 empty messages on a 64-token model: 69,999 commas between them, more than the 4 x 64 + 65,536 =
    65,792 values a request can need; refused before it is decoded, saying so."""
    body = b'{"messages": [' + b",".join([b"{}"] * 70_000) + b"]}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_WAIT_S)) as session:
        async with session.post(f"{frontend.url}/v1/chat/completions", data=body, headers=JSON_HEADERS) as r:
            status, got = r.status, await r.json()
    assert status == 400 and "separates 69999 JSON values" in got["error"]["message"], got
    assert "more than the 65792 a request" in got["error"]["message"] and peer.requests == {}


async def test_separators_inside_strings_are_not_values(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """100,000 commas as a prompt's text on an 8,192-token model: the byte scan is past its 98,304 values,
    the census outside strings finds 1, so the prompt goes on to be tokenized (and is then too long)."""
    frontend = await start_frontend()
    peer = await start_peer(frontend, PeerConfig(max_model_len=8192))
    status, got = await post_bytes(frontend, compact({"prompt": "," * 100_000, "max_tokens": 1}))
    assert status == 400 and "JSON values" not in got["error"]["message"]
    assert "maximum context length is 8192 tokens" in got["error"]["message"] and peer.requests == {}


async def test_a_large_body_is_counted_in_the_worker(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """600,000 empty messages (1.8 MB, past the 1 MiB counted on the loop) on a 100,000-token model: the
    census worker counts 599,999 commas, more than 4 x 100,000 + 65,536 = 465,536; a 400 saying so."""
    frontend = await start_frontend()
    peer = await start_peer(frontend, PeerConfig(max_model_len=100_000))
    body = b'{"messages": [' + b",".join([b"{}"] * 600_000) + b"]}"
    assert len(body) > INLINE_BYTES
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_WAIT_S)) as session:
        async with session.post(f"{frontend.url}/v1/chat/completions", data=body, headers=JSON_HEADERS) as r:
            status, got = r.status, await r.json()
    assert status == 400 and "separates 599999 JSON values" in got["error"]["message"], got
    assert "more than the 465536 a request" in got["error"]["message"] and peer.requests == {}


@pytest.mark.timeout(
    120
)  # the scan this replaced took hours on the inline body, and never ended in the worker
@pytest.mark.parametrize("size", [INLINE_BYTES, 2 * INLINE_BYTES], ids=["inline", "worker"])
async def test_a_string_of_escaped_quotes_that_never_closes_is_a_400_at_once(
    start_frontend: FrontendFactory, start_peer: PeerFactory, size: int
) -> None:
    """{"prompt": " and then \\" to 1 MiB (counted on the loop) or 2 MiB (in the worker), never closed, on a
    100,000-token model: a 400 saying it is not JSON, and /health answers after it."""
    frontend = await start_frontend()
    await start_peer(frontend, PeerConfig(max_model_len=100_000))
    body = b'{"prompt": "' + b'\\"' * ((size - 12) // 2)
    assert (len(body) <= INLINE_BYTES) == (size == INLINE_BYTES)
    status, got = await post_bytes(frontend, body)
    assert status == 400 and got["error"]["message"].startswith("the request body is not valid JSON"), got
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_WAIT_S)) as session:
        async with session.get(f"{frontend.url}/health") as r:
            assert r.status == 200


_BODY_TIMEOUT_S = 0.5


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, Any]:
    """The status line and headers of an answer, and its JSON body; then the server closes the connection."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _WAIT_S)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    body = json.loads(await asyncio.wait_for(reader.readexactly(length), _WAIT_S))
    try:
        rest = await asyncio.wait_for(reader.read(), _WAIT_S)
    except ConnectionResetError:  # the client sent more after the server closed: as closed
        rest = b""
    assert rest == b""  # closed: the rest of the body is not read
    return head, body


@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "trickled"])
async def test_a_body_not_in_within_the_deadline_is_a_408(
    start_frontend: FrontendFactory, start_peer: PeerFactory, trickle: bool
) -> None:
    """A body of 100 bytes by its Content-Length of which 10 come and then nothing, or a byte every 50 ms
    (which would take 5 s): 408 in OpenAI's shape once the 0.5 s deadline passes, and the connection closed;
    nothing reaches the engine."""
    frontend = await start_frontend(body_timeout=_BODY_TIMEOUT_S)
    peer = await start_peer(frontend)
    url = urlsplit(frontend.url)
    assert url.hostname is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)

    async def send() -> None:
        writer.write(_HEAD.format(length=100).format(host=url.netloc).encode() + b'{"prompt":')
        for _ in range(90 if trickle else 0):
            await asyncio.sleep(0.05)
            writer.write(b" ")

    sender = asyncio.create_task(send())
    try:
        head, body = await read_answer(reader)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
    assert head.startswith(b"HTTP/1.1 408 ") and body["error"]["code"] == "request_timeout"
    assert body["error"]["message"].startswith(
        f"the request body was not all received within {_BODY_TIMEOUT_S} s"
    )
    assert peer.requests == {}


async def test_a_chunked_body_is_a_413_as_soon_as_it_passes_the_bound(
    frontend: Frontend, peer: EnginePeer
) -> None:
    """A chunked body sent to 1 KiB past the bound and then held open (never ended): a 413 at once, without
    waiting for the rest (aiohttp's own read would wait for all of it, up to 64 MiB)."""
    url = urlsplit(frontend.url)
    assert url.hostname is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    writer.write(head.format(host=url.netloc).encode())
    for start in range(0, TINY_LIMITS.body + 1024, 65536):
        chunk = (b'{"prompt": "' if start == 0 else b"") + b"a" * 65536
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    try:
        await writer.drain()
        answer, body = await read_answer(reader)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 413 ") and body["error"]["code"] == "request_too_large"
    assert body["error"]["message"].startswith(f"the request body is more than the {TINY_LIMITS.body} bytes")
    assert peer.requests == {}
