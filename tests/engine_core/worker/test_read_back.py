"""One device-to-host read-back per engine step, drafts included (DESIGN: one host sync per step).

The steps run on the CPU, where a read-back is no sync; but every call counted here waits for the device on a
GPU, so the count is exactly what a GPU step would pay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from openinfer.engine_core.builtin_model import (
    BUILTIN_NUM_SPEC_TOKENS,
    builtin_drafter_folder,
    builtin_target_folder,
)
from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.testing.engine_cores import make_core
from openinfer.engine_core.worker.read_back import read_back
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, SamplingParams

# Every Tensor call that copies values to the host (on CUDA: waits for the device).
READS: set[Callable[..., Any]] = {
    torch.Tensor.tolist,
    torch.Tensor.item,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
}
BUDGET = 32  # tokens a step: the 70-token prompt's first two steps are prefill chunks alone
LONG_PROMPT = [(5 * i + 11) % 200 + 3 for i in range(70)]


class ReadBackCounter(TorchFunctionMode):
    """Counts the read-backs of the tensor calls made under it. ``Tensor.to`` counts when it names the host
    ("cpu"): on the CPU a ``.to(device)`` of the engine's own device is what a device-to-device copy is on
    a GPU, never a read-back."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        to_host = func is torch.Tensor.to and any(
            isinstance(a, str) and a.startswith("cpu") for a in (*args[1:], *kwargs.values())
        )
        if func in READS or to_host:
            self.count += 1
        return func(*args, **kwargs)


def requests(stop_token: int) -> list[EngineCoreRequest]:
    """The long prompt first (its chunks fill the first steps alone), then greedy and seeded-sampled requests,
    some asking logprobs (one a repeated phrase: prompt lookup hits it); one ends by ``stop_token``, the
    others by max_tokens."""
    return [
        EngineCoreRequest(
            "long", LONG_PROMPT, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        ),
        EngineCoreRequest(
            "greedy", list(range(40, 46)) * 3, SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
        ),
        EngineCoreRequest(
            "sampled",
            list(range(60, 75)),
            SamplingParams(max_tokens=14, temperature=0.8, seed=7, ignore_eos=True, logprobs=1),
        ),
        EngineCoreRequest(
            "stopped",
            LONG_PROMPT[:20],
            SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=[stop_token], ignore_eos=True),
        ),
    ]


def counted_steps(
    core: EngineCore, batch: list[EngineCoreRequest]
) -> list[tuple[int, list[EngineCoreOutput]]]:
    """Each step's read-backs and outputs, until every request ended (at most 200 steps)."""
    for request in batch:
        core.add_request(request)
    steps = []
    while core.has_work and len(steps) < 200:
        with ReadBackCounter() as counter:
            outputs = core.step()
        steps.append((counter.count, outputs))
    assert not core.has_work
    return steps


def greedy_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    core = make_core(builtin_target_folder())
    core.add_request(EngineCoreRequest("r", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0)))
    return [t for _ in range(max_tokens) for out in core.step() for t in out.new_token_ids]


@pytest.mark.parametrize("method", ["dflash", "ngram", None], ids=["dflash", "ngram", "no drafter"])
def test_one_read_back_per_step(method: str | None) -> None:
    """Every step that samples reads the device back exactly once (prefill, verify steps with drafts, greedy
    and sampled requests, logprobs asked or not, stops by a stop token and by max_tokens, DFlash drafting
    before the read-back); a step of prefill chunks alone reads nothing."""
    stop_token = greedy_tokens(LONG_PROMPT[:20], 8)[5]  # stops "stopped" at its sixth token at the latest
    core = make_core(builtin_target_folder(), max_num_batched_tokens=BUDGET)
    if method is not None:
        k = BUILTIN_NUM_SPEC_TOKENS if method == "dflash" else 4
        core.load_drafter(DrafterSpec(method, k, draft_model=builtin_drafter_folder()))  # type: ignore[arg-type]
    steps = counted_steps(core, requests(stop_token))
    assert [count for count, _ in steps] == [1 if outputs else 0 for _, outputs in steps]
    assert [count for count, _ in steps[:2]] == [0, 0]  # the long prompt's first two chunks
    outputs = [out for _, step in steps for out in step]
    finishes = {out.request_id: out.finish for out in outputs if out.finish is not None}
    assert finishes["stopped"] is not None and finishes["stopped"].stop_token_id == stop_token
    assert {finishes[r].kind for r in ("long", "sampled")} == {"length"}  # type: ignore[union-attr]
    assert all(out.logprobs for out in outputs if out.request_id in ("greedy", "sampled"))
    if core.spec is not None:  # some steps verified drafts
        assert core.spec.counters.num_drafts > 0


def test_read_back_packs_ints_and_floats_exactly() -> None:
    """Integer and float32 parts read back together come back exact: token ids as ints, logprobs as the
    float32 values they were."""
    logprobs = torch.tensor([-0.1, -23.456789], dtype=torch.float32)
    tokens, absent, values = read_back([torch.tensor([[151_645, 0], [7, 2**31 - 1]]), None, logprobs])
    assert tokens == [151_645, 0, 7, 2**31 - 1] and all(type(t) is int for t in tokens)
    assert absent is None
    assert values == logprobs.tolist()
