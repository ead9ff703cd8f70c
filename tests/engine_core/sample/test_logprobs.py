"""Engine logprobs: HF's raw log_softmax at each output position, with or without speculation."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from transformers import Qwen3ForCausalLM

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.testing.engine_cores import make_core, spec_prompts
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3 as SMALL
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.protocol import EngineCoreRequest, SamplingParams, TokenLogprobs

TOP = 4  # alternatives asked for


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("target") / "t", seed=5, overrides=SMALL)


def run(
    core: EngineCore, prompts: list[list[int]], params: list[SamplingParams]
) -> list[tuple[list[int], list[TokenLogprobs] | None]]:
    """All prompts as one batch; each request's tokens and logprobs (None when not asked for)."""
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    logprobs: dict[str, list[TokenLogprobs] | None] = {str(i): None for i in range(len(prompts))}
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        core.add_request(EngineCoreRequest(str(i), prompt, p))
    while core.has_work:
        for out in core.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.logprobs is not None:
                assert len(out.logprobs) == len(out.new_token_ids)
                logprobs[out.request_id] = (logprobs[out.request_id] or []) + out.logprobs
    return [(tokens[str(i)], logprobs[str(i)]) for i in range(len(prompts))]


def greedy(max_tokens: int, logprobs: int | None) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=logprobs)


def test_logprobs_are_hf_log_softmax(target: Path) -> None:
    """Greedy: the sampled token is the top-1, its logprob is HF's log_softmax there (1e-4), and the top
    k are HF's k largest; requests without logprobs in the same batch get none."""
    prompts = spec_prompts()[:4]
    params = [greedy(12, TOP), greedy(12, None), greedy(9, 0), greedy(5, 1)]
    results = run(make_core(target), prompts, params)
    assert results[1][1] is None
    hf = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    for prompt, p, (output, logprobs) in zip(prompts, params, results, strict=True):
        if p.logprobs is None:
            continue
        assert logprobs is not None and len(logprobs) == len(output) == p.max_tokens
        with torch.inference_mode():
            expected = torch.log_softmax(hf(torch.tensor([prompt + output])).logits[0], dim=-1)
        for i, (token, entry) in enumerate(zip(output, logprobs, strict=True)):
            row = expected[len(prompt) - 1 + i]  # the position that produced output[i]
            assert abs(entry.logprob - row[token].item()) <= 1e-4
            assert len(entry.top_token_ids) == len(entry.top_logprobs) == p.logprobs
            if p.logprobs:
                assert entry.top_token_ids[0] == token  # greedy: the sampled token is the most likely
                assert entry.top_logprobs == sorted(entry.top_logprobs, reverse=True)
                hf_top = row.topk(p.logprobs)
                assert torch.allclose(torch.tensor(entry.top_logprobs), hf_top.values, atol=1e-4)


def test_logprobs_with_ngram_speculation_equal_those_without(target: Path) -> None:
    """ngram K=5 (accepted drafts and bonus tokens each read from their own verified row): the same tokens
    and the same logprobs as a run without speculation."""
    prompts = spec_prompts()  # half of them repetitive: prompt lookup hits and drafts get accepted
    params = [greedy(n, TOP if i % 3 else None) for i, n in enumerate([30, 5, 13, 30, 2, 9, 25, 17])]
    plain = run(make_core(target), prompts, params)
    core = make_core(target, speculative=DrafterSpec("ngram", 5))
    speculated = run(core, prompts, params)
    assert core.spec is not None and core.spec.counters.num_accepted_tokens > 0  # drafts really accepted
    for (tokens, logprobs), (spec_tokens, spec_logprobs) in zip(plain, speculated, strict=True):
        assert spec_tokens == tokens
        if logprobs is None:
            assert spec_logprobs is None
            continue
        assert spec_logprobs is not None
        for entry, spec_entry in zip(logprobs, spec_logprobs, strict=True):
            assert spec_entry.top_token_ids == entry.top_token_ids
            assert abs(spec_entry.logprob - entry.logprob) <= 1e-4
            assert torch.allclose(
                torch.tensor(spec_entry.top_logprobs), torch.tensor(entry.top_logprobs), atol=1e-4
            )


def test_sampled_logprobs_ignore_temperature(target: Path) -> None:
    """At temperature 2 with top_k 3 the logprob is still the raw distribution's (vLLM's default), and a
    stop token's logprob is sent with it."""
    prompt = spec_prompts()[3]
    params = SamplingParams(max_tokens=20, temperature=2.0, top_k=3, seed=7, logprobs=2, ignore_eos=True)
    [(output, logprobs)] = run(make_core(target), [prompt], [params])
    assert logprobs is not None and len(logprobs) == len(output)
    hf = Qwen3ForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([prompt + output])).logits[0], dim=-1)
    for i, (token, entry) in enumerate(zip(output, logprobs, strict=True)):
        assert abs(entry.logprob - expected[len(prompt) - 1 + i][token].item()) <= 1e-4
    stop = output[4]
    with_stop = msgspec.structs.replace(params, stop_token_ids=[stop])
    [(stopped, stopped_logprobs)] = run(make_core(target), [prompt], [with_stop])
    assert stopped[-1] == stop and stopped_logprobs is not None and len(stopped_logprobs) == len(stopped)


def test_logprobs_out_of_range_are_refused(target: Path) -> None:
    """logprobs past the vocabulary size end the request with an error saying the allowed range."""
    core = make_core(target)
    core.add_request(EngineCoreRequest("r", [5, 6], SamplingParams(max_tokens=2, logprobs=513)))
    [out] = core.step()
    assert out.finish is not None and out.finish.kind == "error" and "[0, 512]" in (out.finish.message or "")
