"""openinfer's DFlash rounds side by side with z-lab's reference (PyPI `dflash`, `dflash_generate`).

Both load the same target and drafter folders and run greedy. z-lab's `dflash_generate(block_size=n)`
verifies n tokens a round: the current one and n - 1 drafts, its last block cut to the tokens left
(`max_length - start`); its `acceptance_lengths` counts the tokens each round produced, so a round's accepted
drafts are `acceptance_length - 1`. One documented difference: with a single token left, the reference still
drafts one token, whose fate cannot change the output since that token is the last; openinfer's drafts never
run past max_tokens (docs/design.md), so it decodes that token without a draft. `ReferenceRun.rounds` leaves
exactly those rounds out (`final_rounds` counts them).

Needs the `dflash` package (the test extra); used by tests/engine_core/spec_decode/test_dflash_reference.py and
benchmarks/dflash_reference.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.process.engine_cli import load_runner
from openinfer.engine_core.testing.spec_logs import read_spec_log
from openinfer.protocol import EngineCoreRequest, SamplingParams


@dataclass(frozen=True)
class Run:
    """One prompt's greedy output and its rounds: accepted drafts per round, and each draft's length."""

    tokens: list[int]
    rounds: list[int]  # accepted draft tokens per round
    # draft tokens per round; for the reference, what openinfer drafts in that round: the block's drafts,
    # less the one past the last token's (its verified block holds min(K + 1, tokens left + 1) tokens)
    draft_lengths: list[int]
    final_rounds: int = 0  # reference only: single-token-left rounds, left out of `rounds`


def load_reference(target_folder: Path, draft_folder: Path) -> tuple[Any, Any]:
    """(transformers' Qwen3ForCausalLM, z-lab's DFlashDraftModel), float32, with z-lab's stats timer made
    CPU-safe (it calls torch.cuda.synchronize())."""
    import dflash.model as zlab
    from transformers import Qwen3ForCausalLM

    zlab._cuda_time = time.perf_counter
    target = Qwen3ForCausalLM.from_pretrained(target_folder, dtype=torch.float32).eval()
    draft = zlab.DFlashDraftModel.from_pretrained(draft_folder, dtype=torch.float32).eval()
    return target, draft


def reference_runs(
    target_folder: Path, draft_folder: Path, k: int, prompts: list[list[int]], max_tokens: list[int]
) -> list[Run]:
    """z-lab's dflash_generate (block_size K + 1, no stop tokens) per prompt, float32 on the CPU."""
    import dflash.model as zlab

    target, draft = load_reference(target_folder, draft_folder)
    runs = []
    for prompt, n in zip(prompts, max_tokens, strict=True):
        result = zlab.dflash_generate(
            draft,
            target,
            torch.tensor([prompt]),
            n,
            None,
            temperature=0.0,
            block_size=k + 1,
            return_stats=True,
        )
        max_length = len(prompt) + n
        start, rounds, lengths, final = len(prompt), [], [], 0
        for produced in result.acceptance_lengths:
            if max_length - start > 2:
                rounds.append(produced - 1)
                lengths.append(min(k, max_length - start - 2))
            else:
                final += 1
            start += produced
        runs.append(Run(result.output_ids[0, len(prompt) :].tolist(), rounds, lengths, final))
    return runs


def openinfer_runs(
    target_folder: Path,
    draft_folder: Path,
    k: int,
    prompts: list[list[int]],
    max_tokens: list[int],
    spec_log: Path,
    **config: object,
) -> list[Run]:
    """The same from one EngineCore serving every prompt at once (batched drafts, paged context); rounds
    are read from its --spec-log. `config` adds EngineConfig fields (e.g. max_num_batched_tokens)."""
    engine_config = EngineConfig(
        model_path=target_folder,
        served_model_name="reference-check",
        speculative=DrafterSpec("dflash", k, draft_folder),
        spec_log=spec_log,
        **config,  # type: ignore[arg-type]
    )
    core = EngineCore(engine_config, load_runner(engine_config))
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    while core.has_work:
        for output in core.step():
            tokens[output.request_id].extend(output.new_token_ids)
    lines = read_spec_log(spec_log)
    runs = []
    for i in range(len(prompts)):
        mine = [x for x in lines if x["request_id"] == str(i)]
        runs.append(
            Run(tokens[str(i)], [x["num_accepted"] for x in mine], [x["num_draft_tokens"] for x in mine])
        )
    return runs
