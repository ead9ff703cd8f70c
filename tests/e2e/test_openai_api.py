"""The official openai client against a real frontend (with --api-key) and a real CPU engine with n-gram
speculation: chat and completions, streaming, usage, stop strings, logprobs, errors, request ids."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

from tests.e2e.processes import Cluster

KEY = "e2e-secret"
PROMPT = "ROMEO: But soft, what light through yonder window breaks"
MESSAGES = [
    {"role": "system", "content": "You are Juliet."},
    {"role": "user", "content": "Wherefore art thou?"},
]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def api_cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Cluster]:
    """A frontend that needs KEY and one CPU engine with ngram K=4 speculation."""
    c = Cluster(tmp_path_factory.mktemp("api"))
    try:
        c.start_frontend("--api-key", KEY)
        c.start_engine(tiny_model, 0, "--spec-method", "ngram", "--num-spec-tokens", "4")
        c.wait_healthy()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def client(api_cluster: Cluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{api_cluster.url}/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(tiny_model)


def hf_logprobs(model: Path, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """Teacher-forced log_softmax at the positions that produced each output token: (len(output), vocab)."""
    hf = Qwen3ForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt_ids + output_ids])).logits[0]
    return torch.log_softmax(logits, dim=-1)[len(prompt_ids) - 1 : -1]


def test_chat_through_the_model_chat_template(
    client: openai.OpenAI, hf_tokenizer: PreTrainedTokenizerFast
) -> None:
    """Chat renders the built-in ChatML template as transformers does (prompt_tokens), answers as a
    completion of that prompt would, and streams the same content: role chunk first, usage last."""
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, **GREEDY)  # type: ignore[arg-type]
    rendered = hf_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    prompt_ids = hf_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    assert chat.usage is not None and chat.usage.prompt_tokens == len(prompt_ids)
    assert chat.usage.completion_tokens == 10 and chat.choices[0].finish_reason == "length"
    message = chat.choices[0].message
    assert message.role == "assistant" and message.content
    completion = client.completions.create(model="tiny", prompt=rendered, max_tokens=10, **GREEDY)  # type: ignore[arg-type]
    assert completion.choices[0].text == message.content

    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=10, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}, **GREEDY,
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == chat.usage.total_tokens


def test_completions_streaming_and_usage(client: openai.OpenAI) -> None:
    """Completions, whole and streamed, give the same text; usage counts prompt and output tokens."""
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, **GREEDY)  # type: ignore[arg-type]
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    chunks = list(
        client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=12, stream=True,
            stream_options={"include_usage": True}, **GREEDY,  # type: ignore[arg-type]
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    streamed = chunks[-1].usage
    assert streamed is not None and streamed.prompt_tokens_details is not None
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (whole.usage.prompt_tokens, 12)
    # The second time, its full blocks come from the prefix cache (all but the block of its last token).
    blocks = (whole.usage.prompt_tokens - 1) // 16
    assert streamed.prompt_tokens_details.cached_tokens == 16 * blocks


def pick_stop(text: str) -> tuple[str, int]:
    """A 3-character stop string from the middle of ``text`` whose first occurrence is where it was taken."""
    for start in range(len(text) // 3, len(text) - 3):
        stop = text[start : start + 3]
        if "\ufffd" not in stop and stop.strip() and text.find(stop) == start:
            return stop, start
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("chat", [False, True])
def test_stop_string_from_a_greedy_output(client: openai.OpenAI, chat: bool) -> None:
    """A stop string taken from the greedy output cuts it exactly before the string, streamed or not,
    with finish_reason "stop" and the string as stop_reason; generation ends early."""
    kwargs = {"model": "tiny", "max_tokens": 40, **GREEDY}

    def run(**extra: object) -> tuple[str, str | None, object, int]:
        if chat:
            r = client.chat.completions.create(messages=MESSAGES, **kwargs, **extra)  # type: ignore[call-overload]
            choice = r.choices[0]
            return (
                choice.message.content or "",
                choice.finish_reason,
                choice.model_extra["stop_reason"],
                r.usage.completion_tokens,
            )
        r = client.completions.create(prompt=PROMPT, **kwargs, **extra)  # type: ignore[call-overload]
        choice = r.choices[0]
        return choice.text, choice.finish_reason, choice.model_extra["stop_reason"], r.usage.completion_tokens

    full, _, _, _ = run()
    stop, start = pick_stop(full)
    text, finish_reason, stop_reason, num_tokens = run(stop=[stop, "never-occurs"])
    assert (text, finish_reason, stop_reason) == (full[:start], "stop", stop)
    assert num_tokens < 40
    if chat:
        streamed = client.chat.completions.create(messages=MESSAGES, stream=True, stop=stop, **kwargs)  # type: ignore[call-overload]
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == full[:start]
    else:
        streamed = client.completions.create(prompt=PROMPT, stream=True, stop=stop, **kwargs)  # type: ignore[call-overload]
        assert "".join(c.choices[0].text for c in streamed if c.choices) == full[:start]


def test_completion_logprobs_are_hf_log_softmax(client: openai.OpenAI, tiny_model: Path) -> None:
    """Greedy with logprobs=3 (under ngram speculation): each sampled token is the top-1 and its logprob is
    HF's teacher-forced log_softmax there, to 1e-4; the alternatives are among HF's 3 most likely."""
    extra = {"ignore_eos": True, "return_token_ids": True}
    r = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, logprobs=3, extra_body=extra
    )
    choice = r.choices[0]
    prompt_ids, output_ids = choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    expected = hf_logprobs(tiny_model, prompt_ids, output_ids)
    for i, token in enumerate(output_ids):
        assert abs(logprobs.token_logprobs[i] - expected[i, token].item()) <= 1e-4
        top = logprobs.top_logprobs[i]
        assert max(top.values()) == logprobs.token_logprobs[i]  # greedy: the sampled token is the top-1
        hf_top = expected[i].topk(3).values.tolist()
        # Keyed by token text, so tokens with the same text (a partial character's U+FFFD) share an entry.
        assert all(min(abs(value - h) for h in hf_top) <= 1e-4 for value in top.values())
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0


def test_chat_logprobs(client: openai.OpenAI, tiny_model: Path) -> None:
    """Chat logprobs=true, top_logprobs=2: one entry per output token, top-1 first and equal to it, the
    logprob HF's; the bytes of the non-special tokens make up the content exactly."""
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,  # type: ignore[arg-type]
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    output_ids = r.choices[0].model_extra["token_ids"]
    assert content is not None and len(content) == len(output_ids) == 12
    expected = hf_logprobs(tiny_model, r.model_extra["prompt_token_ids"], output_ids)
    for i, (token, entry) in enumerate(zip(output_ids, content, strict=True)):
        assert abs(entry.logprob - expected[i, token].item()) <= 1e-4
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob == entry.logprob
    special = {0, 1, 2}  # the built-in tokenizer's special tokens are not in the content
    text = b"".join(
        bytes(e.bytes or []) for t, e in zip(output_ids, content, strict=True) if t not in special
    )
    assert text.decode("utf-8", errors="replace") == r.choices[0].message.content


def test_seed_makes_sampling_repeatable(client: openai.OpenAI) -> None:
    """Sampling at temperature 1 with the same seed gives the same text."""
    texts = {
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, seed=11, user="u1")
        .choices[0]
        .text
        for _ in range(2)
    }
    assert len(texts) == 1


def test_n_choices_are_the_requests_seeded_seed_plus_i(client: openai.OpenAI) -> None:
    """n=3 sampled with a seed (vLLM's children): three choices, not all alike, each the text of the n=1
    request seeded seed + i, the same on a second request and, by index, in a stream; chat's n=2 alike."""
    sampled = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 21}
    whole = client.completions.create(n=3, **sampled)  # type: ignore[call-overload]
    assert [c.index for c in whole.choices] == [0, 1, 2]
    texts = [c.text for c in whole.choices]
    assert len(set(texts)) > 1
    singles = [client.completions.create(**{**sampled, "seed": 21 + i}).choices[0].text for i in range(3)]  # type: ignore[call-overload]
    assert singles == texts
    assert [c.text for c in client.completions.create(n=3, **sampled).choices] == texts  # type: ignore[call-overload]
    streamed = ["", "", ""]
    for chunk in client.completions.create(n=3, stream=True, **sampled):  # type: ignore[call-overload]
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts

    chat = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "seed": 4}
    answer = client.chat.completions.create(n=2, **chat)  # type: ignore[call-overload]
    contents = [c.message.content for c in answer.choices]
    assert contents == [
        client.chat.completions.create(**{**chat, "seed": 4 + i}).choices[0].message.content  # type: ignore[call-overload]
        for i in range(2)
    ]


def test_wrong_api_key_is_401(api_cluster: Cluster) -> None:
    """A wrong key is 401 on chat and completions (the openai client's AuthenticationError); /health and
    /metrics need none."""
    with openai.OpenAI(base_url=f"{api_cluster.url}/v1", api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model="tiny", prompt=PROMPT)
    for path in ("/health", "/metrics"):
        with urllib.request.urlopen(f"{api_cluster.url}{path}", timeout=5) as response:
            assert response.status == 200


def test_request_id_is_echoed_and_logged(client: openai.OpenAI, api_cluster: Cluster) -> None:
    """X-Request-Id becomes the response id's suffix, comes back as a header, and is in the frontend's
    log line for the request."""
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=PROMPT, max_tokens=2, extra_headers={"X-Request-Id": "e2e-trace-7"}
    )
    assert raw.headers["X-Request-Id"] == "e2e-trace-7"
    assert raw.parse().id == "cmpl-e2e-trace-7"
    log = api_cluster.log_dir / "frontend.log"
    deadline = time.monotonic() + 10  # the line is written as the response ends: allow a busy machine
    while "request_id=e2e-trace-7" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "request_id=e2e-trace-7" in log.read_text()
