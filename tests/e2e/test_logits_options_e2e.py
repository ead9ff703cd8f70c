"""Penalties, logit bias, bad words and min_tokens end to end: the openai client against a real frontend and
a CPU engine with n-gram speculation gets the tokens an in-process engine without speculation makes from
the same SamplingParams, within the constraints asked for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.process.engine_cli import load_runner
from openinfer.frontend.openai.logits_options import bad_words_token_ids
from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import EngineCoreRequest, SamplingParams
from tests.e2e.processes import Cluster

PROMPT = "To be, or not to be, that is the question. To be, or not to be"
OPENAI_OPTIONS: dict[str, Any] = {
    "frequency_penalty": -0.5,  # repeats: the n-gram drafts are accepted
    "presence_penalty": 0.3,
    "logit_bias": {"7": 2.0},
}
VLLM_OPTIONS: dict[str, Any] = {  # the extra body
    "repetition_penalty": 1.1,
    "bad_words": ["the question", "be"],
    "min_tokens": 12,
    "stop_token_ids": [7],  # biased up, but held back for the first 12 tokens
    "ignore_eos": True,
    "return_token_ids": True,
}


@pytest.fixture(scope="module")
def ngram_cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Cluster]:
    """A frontend and one CPU engine with ngram K=4 speculation."""
    c = Cluster(tmp_path_factory.mktemp("logits"))
    try:
        c.start_frontend()
        c.start_engine(tiny_model, 0, "--spec-method", "ngram", "--num-spec-tokens", "4")
        c.wait_healthy()
        yield c
    finally:
        c.stop()


def in_process_tokens(model: Path, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The same request run by an engine core in this process, without speculation."""
    tokenizer = Tokenizer(
        (model / "tokenizer.json").read_bytes(), (model / "tokenizer_config.json").read_bytes()
    )
    config = EngineConfig(model_path=model, served_model_name="tiny")
    core = EngineCore(config, load_runner(config))
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, stop_token_ids=[7],
        repetition_penalty=1.1, frequency_penalty=-0.5, presence_penalty=0.3, logit_bias={7: 2.0}, min_tokens=12,
        bad_words_token_ids=bad_words_token_ids(tuple(VLLM_OPTIONS["bad_words"]), tokenizer, core.facts.vocab_size),
    )  # fmt: skip
    core.add_request(EngineCoreRequest("r", prompt_ids, params))
    tokens = []
    while core.has_work:
        for out in core.step():
            tokens.extend(out.new_token_ids)
    return tokens


def test_options_through_the_stack_match_an_engine_without_drafts(
    ngram_cluster: Cluster, tiny_model: Path
) -> None:
    """Completion and chat with every option: 200s, completion tokens equal an in-process engine's without
    speculation from the same parameters, at least min_tokens of them, no bad word in the text."""
    with openai.OpenAI(
        base_url=f"{ngram_cluster.url}/v1", api_key="none", max_retries=0, timeout=60
    ) as client:
        completion = client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            extra_body=VLLM_OPTIONS,
            **OPENAI_OPTIONS,
        )
        choice = completion.choices[0]
        tokens = choice.model_extra["token_ids"]  # type: ignore[index]
        prompt_ids = choice.model_extra["prompt_token_ids"]  # type: ignore[index]
        assert tokens == in_process_tokens(tiny_model, prompt_ids, 24)
        assert len(tokens) >= 12 and 7 not in tokens[:12]
        assert "the question" not in choice.text
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=16, temperature=0,
            extra_body=VLLM_OPTIONS, **OPENAI_OPTIONS,
        )  # fmt: skip
        assert chat.usage is not None and chat.usage.completion_tokens >= 12
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model="tiny", prompt=PROMPT, presence_penalty=2.5)
        assert raised.value.body["param"] == "presence_penalty"  # type: ignore[index]
