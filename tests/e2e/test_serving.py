"""A real frontend and engine on loopback, queried over HTTP by aiohttp and by the official openai client."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import openai
import pytest
import torch
from transformers import Qwen3ForCausalLM

from tests.e2e.processes import Cluster

PROMPT = "ROMEO: But soft, what light"


async def post(session: aiohttp.ClientSession, url: str, body: object) -> tuple[int, dict]:
    async with session.post(url, json=body) as r:
        return r.status, await r.json()


async def test_completion_tokens_are_transformers_greedy(cluster: Cluster, tiny_model: Path) -> None:
    """Greedy output through the whole stack is HF's teacher-forced argmax at every position."""
    async with aiohttp.ClientSession() as s:
        status, body = await post(
            s,
            f"{cluster.url}/v1/completions",
            {
                "model": "tiny",
                "prompt": PROMPT,
                "max_tokens": 20,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )
    assert status == 200, body
    choice = body["choices"][0]
    prompt_ids, output_ids = choice["prompt_token_ids"], choice["token_ids"]
    assert len(output_ids) == 20 and choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 20,
        "total_tokens": len(prompt_ids) + 20,
        "prompt_tokens_details": {"cached_tokens": 0},  # the engine's first request: nothing cached yet
    }
    hf = Qwen3ForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt_ids + output_ids])).logits[0]
    for i, token in enumerate(output_ids):
        row = logits[len(prompt_ids) - 1 + i]
        assert (row.max() - row[token]).item() <= 1e-3


async def test_streaming_equals_non_streaming(cluster: Cluster) -> None:
    """The SSE stream's text deltas concatenate to the non-streaming text; it ends with [DONE]."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        _, whole = await post(s, f"{cluster.url}/v1/completions", body)
        async with s.post(f"{cluster.url}/v1/completions", json={**body, "stream": True}) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            events = [line[6:] for line in (await r.text()).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_official_openai_client(cluster: Cluster) -> None:
    """openai.OpenAI works unchanged: models, completions, streaming completions."""
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    completion = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    stream = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    assert "".join(c.choices[0].text for c in stream) == completion.choices[0].text


async def test_health_models_and_metrics(cluster: Cluster) -> None:
    """/health is 200 with an engine up; /metrics has the load gauges and token counters per engine."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{cluster.url}/health") as r:
            assert r.status == 200
        async with s.get(f"{cluster.url}/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "tiny"
        await post(
            s, f"{cluster.url}/v1/completions", {"prompt": "to be", "max_tokens": 3, "ignore_eos": True}
        )
        async with s.get(f"{cluster.url}/metrics") as r:
            text = await r.text()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
    ):
        assert re.search(rf'^{re.escape(name)}\{{[^}}]*engine="0"', text, re.M) or name.endswith("_bucket"), (
            name
        )
        assert name in text, name
    assert re.search(r'^openinfer:engine_up\{engine="0"\} 1\.0$', text, re.M)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        ({"model": "tiny"}, 400),  # missing prompt
        ({"model": "tiny", "prompt": "a", "max_tokens": 0}, 400),
        ({"model": "tiny", "prompt": "a", "max_tokens": -3}, 400),
        ({"model": "tiny", "prompt": [5] * 300}, 400),  # longer than max_model_len (256)
        ({"model": "tiny", "prompt": [100000]}, 400),  # not a token of the vocabulary
        ({"model": "no-such-model", "prompt": "a"}, 404),
    ],
)
async def test_bad_input_gets_openai_error(cluster: Cluster, body: object, status: int) -> None:
    """Bad requests get an OpenAI-style error body with a 4xx status, and the server keeps serving."""
    async with aiohttp.ClientSession() as s:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with s.post(
            f"{cluster.url}/v1/completions", data=data, headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == status
            error = (await r.json())["error"]
            assert error["message"] and error["type"]
        ok, _ = await post(s, f"{cluster.url}/v1/completions", {"prompt": "to be", "max_tokens": 2})
        assert ok == 200


async def test_client_disconnect_aborts_on_engine(cluster: Cluster) -> None:
    """A streaming client that goes away frees its request on the engine (running gauge back to 0)."""
    async with aiohttp.ClientSession() as s:
        r = await s.post(
            f"{cluster.url}/v1/completions",
            json={"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stream": True},
        )
        await r.content.readline()
        r.close()
        for _ in range(50):
            await asyncio.sleep(0.1)
            async with s.get(f"{cluster.url}/metrics") as m:
                text = await m.text()
            if re.search(r"^vllm:num_requests_running\{[^}]*\} 0\.0$", text, re.M):
                break
        else:
            pytest.fail("the request kept running after its client disconnected")
