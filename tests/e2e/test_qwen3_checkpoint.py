"""A checkpoint in Qwen3-0.6B's real layout served by real processes: its widths (2 layers), bf16 weights in
2 shards with an index, Qwen3's 151,669-token vocabulary under 151,936 embedding rows, generation_config's
two EOS ids and the chat template in chat_template.jinja. Greedy parity with transformers in float32 and in
bfloat16 (`openinfer-serve --dtype bfloat16`), and chat prompts equal to apply_chat_template's."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from openinfer.engine_core.testing.hf_greedy import assert_hf_greedy, teacher_forced_logits
from openinfer.engine_core.testing.qwen3_checkpoint import make_qwen3_0_6b_shaped_checkpoint
from tests.e2e.processes import Cluster

_rng = random.Random(7)
# Text ids, <|im_start|> and <|endoftext|>, and two ids past the tokenizer (151669..151935: padding rows
# the engine takes, since they are in its vocab_size); then 19 ids drawn from all 151,936.
PROMPTS = [
    [9707, 11, 1879, 0, 151644, 151643, 151700, 151935, 220],
    [_rng.randrange(151936) for _ in range(19)],
]
MAX_TOKENS = 8
MESSAGES = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What light through yonder window breaks?"},
    {"role": "assistant", "content": "<think>\nJuliet.\n</think>\n\nIt is the east."},
    {"role": "user", "content": "naïve café 日本語 🙂"},
]


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_qwen3_0_6b_shaped_checkpoint(tmp_path_factory.mktemp("qwen3") / "Qwen3-0.6B-shaped")


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory, qwen3_model: Path) -> Iterator[dict[str, Cluster]]:
    """Started together: a frontend and an engine with --dtype auto (float32 on the CPU), and an
    openinfer-serve --dtype bfloat16 (its own frontend and engine); both serve the checkpoint as "tiny"."""
    started = {
        "float32": Cluster(tmp_path_factory.mktemp("f32")),
        "bfloat16": Cluster(tmp_path_factory.mktemp("bf16")),
    }
    try:
        started["float32"].start_frontend()
        started["float32"].start_engine(qwen3_model)
        started["bfloat16"].start_serve(qwen3_model, "--dtype", "bfloat16")
        for cluster in started.values():
            cluster.wait_healthy(timeout=120)
        yield started
    finally:
        for cluster in started.values():
            cluster.stop()


async def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as response:
            answer = await response.json()
            assert response.status == 200, answer
            return answer


async def greedy(cluster: Cluster) -> list[list[int]]:
    """Every prompt at once (one batch on the engine), greedy, MAX_TOKENS each; their output ids."""
    body = {
        "model": "tiny",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    answers = await asyncio.gather(
        *(post(f"{cluster.url}/v1/completions", {**body, "prompt": p}) for p in PROMPTS)
    )
    for prompt, answer in zip(PROMPTS, answers, strict=True):
        assert answer["choices"][0]["prompt_token_ids"] == prompt  # ids past the tokenizer were taken
    return [answer["choices"][0]["token_ids"] for answer in answers]


async def test_float32_greedy_is_transformers_greedy(clusters: dict[str, Cluster], qwen3_model: Path) -> None:
    """dtype auto on the CPU computes in float32 from the bf16 shards: teacher-forced, every token is
    transformers' float32 argmax or within 1e-3 of it (docs/design.md invariant 1)."""
    outputs = await greedy(clusters["float32"])
    assert all(len(output) == MAX_TOKENS for output in outputs)
    assert_hf_greedy(qwen3_model, PROMPTS, outputs)


async def test_bfloat16_greedy_is_transformers_bfloat16_greedy(
    clusters: dict[str, Cluster], qwen3_model: Path
) -> None:
    """openinfer-serve --dtype bfloat16: teacher-forced, every token is within TOL of transformers'
    bfloat16 argmax, and most are that argmax.

    The tolerance, measured on the same sequences: eps = max |HF bf16 - HF fp32| over every logit
    (bf16 keeps 8 significant bits; here eps is ~0.5 on logits up to ~35, where one bf16 step is 0.25).
    Our bf16 logits differ from exact ones by errors of the same kind (bf16 matmuls, fp32 norms and
    softmax), so |ours - HF bf16| <= 2 eps; our token t maximises ours, so HF bf16's argmax a has
    HF[a] - HF[t] <= |HF[a] - ours[a]| + |ours[t] - HF[t]| <= 4 eps = TOL. Only a few of 151,936 logits
    lie that close to the top (their spread is ~6), so a wrong model would still fail."""
    outputs = await greedy(clusters["bfloat16"])
    assert all(len(output) == MAX_TOKENS for output in outputs)
    hf_bf16 = Qwen3ForCausalLM.from_pretrained(qwen3_model, dtype=torch.bfloat16).eval()
    hf_fp32 = Qwen3ForCausalLM.from_pretrained(qwen3_model, dtype=torch.float32).eval()
    gaps, eps = [], 0.0
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        logits = teacher_forced_logits(hf_bf16, prompt, output)  # (MAX_TOKENS, vocab)
        eps = max(eps, (logits - teacher_forced_logits(hf_fp32, prompt, output)).abs().max().item())
        gaps += [(row.max() - row[token]).item() for token, row in zip(output, logits, strict=True)]
    assert 0 < eps < 1.0, eps  # bf16 rounding happened, and stayed bf16-sized
    assert max(gaps) <= 4 * eps, (gaps, eps)
    assert sum(gap == 0 for gap in gaps) >= len(gaps) // 2, gaps


@pytest.mark.parametrize("template_kwargs", [{}, {"enable_thinking": False}])
async def test_chat_prompt_is_apply_chat_template(
    clusters: dict[str, Cluster], qwen3_model: Path, template_kwargs: dict[str, Any]
) -> None:
    """tokenizer_config.json holds no template (transformers 5 saves it as chat_template.jinja): the engine
    sends the file's template in its hello and the chat endpoint renders it; the prompt ids are
    transformers' apply_chat_template ids on the same folder, thinking switch included."""
    assert "chat_template" not in json.loads((qwen3_model / "tokenizer_config.json").read_text())
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 2,
        "temperature": 0,
        "return_token_ids": True,
        "chat_template_kwargs": template_kwargs,
    }
    answer = await post(f"{clusters['float32'].url}/v1/chat/completions", body)
    hf_tokenizer = AutoTokenizer.from_pretrained(qwen3_model)
    expected = hf_tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
    )
    assert answer["prompt_token_ids"] == expected
    # <|im_start|> first; the prompt ends "<|im_start|>assistant\n", or its empty "</think>\n\n" block.
    assert expected[0] == 151644
    assert expected[-3:] == ([271, 151668, 271] if template_kwargs else [151644, 77091, 198])
    assert answer["usage"]["prompt_tokens"] == len(expected)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]  # fmt: skip
TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Verona"}'},
}
REPLY = {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}
THOUGHT = "<think>\nLook it up.\n</think>\n\n"


async def test_chat_prompt_with_tools_is_apply_chat_template(
    clusters: dict[str, Cluster], qwen3_model: Path
) -> None:
    """tools, an assistant's tool_calls and the tool's answer render as transformers renders the same
    conversation (the tool call's arguments as an object, as its templates take them); tool_choice
    "none" renders the tools on a frontend without tool parsing."""
    messages = [*MESSAGES, {"role": "assistant", "content": THOUGHT, "tool_calls": [TOOL_CALL]}, REPLY]
    body = {"model": "tiny", "messages": messages, "tools": TOOLS, "tool_choice": "none", "max_tokens": 1,
            "return_token_ids": True}  # fmt: skip
    answer = await post(f"{clusters['float32'].url}/v1/chat/completions", body)
    call = {**TOOL_CALL, "function": {"name": "get_weather", "arguments": {"city": "Verona"}}}
    expected_messages = [*MESSAGES, {"role": "assistant", "content": THOUGHT, "tool_calls": [call]}, REPLY]
    hf_tokenizer = AutoTokenizer.from_pretrained(qwen3_model)
    expected = hf_tokenizer.apply_chat_template(
        expected_messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert answer["prompt_token_ids"] == expected
    text = hf_tokenizer.decode(expected)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Verona"}}\n</tool_call>' in text
    assert '<tool_response>\n{"sky": "clear"}\n</tool_response>' in text
