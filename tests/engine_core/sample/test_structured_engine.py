"""Structured outputs in the engine: what a constrained request writes fits its constraint whatever the
weights; greedy with a constraint is lossless with n-gram and DFlash drafters (each draft checked against the
grammar after the drafts before it); a request waiting for its grammar holds up no other; a constraint that
does not compile ends its request as the client's error."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from openinfer.engine_core.config import DrafterSpec
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.sample.structured_output import COMPILE_THREADS
from openinfer.engine_core.testing.engine_cores import generate_with as generate
from openinfer.engine_core.testing.engine_cores import make_core, spec_prompts
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, SamplingParams, StructuredOutputs

K = 7
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["thou", "art"]},
    },
    "required": ["name", "n", "ok", "kind"],
    "additionalProperties": False,
}
CHOICES = ["thou art", "ROMEO", "my lord"]
GRAMMAR = 'root ::= "(" item ("," item)? ("," item)? ")"\nitem ::= [a-z] [a-z]? [a-z]?'
CONSTRAINTS = {
    "json": StructuredOutputs("json", json.dumps(SCHEMA), any_whitespace=False),
    "json_object": StructuredOutputs("json_object", "", any_whitespace=False),
    "regex": StructuredOutputs("regex", r"[0-9]{2,4}-(yes|no)"),
    "choice": StructuredOutputs("choice", json.dumps(CHOICES)),
    "grammar": StructuredOutputs("grammar", GRAMMAR),
}
MAX_TOKENS = 60


def fits(name: str, text: str) -> bool:
    if name == "json":
        value = json.loads(text, strict=False)  # xgrammar's strings may hold raw control characters
        return set(value) == set(SCHEMA["required"]) and len(value["name"]) <= 6 and 0 <= value["n"] <= 99
    if name == "json_object":
        return isinstance(json.loads(text, strict=False), dict)
    if name == "regex":
        return re.fullmatch(r"[0-9]{2,4}-(yes|no)", text) is not None
    if name == "choice":
        return text in CHOICES
    return re.fullmatch(r"\([a-z]{1,3}(,[a-z]{1,3}){0,2}\)", text) is not None


def constrained(core: EngineCore, name: str, **options: object) -> tuple[list[list[int]], list[str]]:
    """Every prompt under the constraint, stopping at EOS (the grammar's end)."""
    options = {
        "ignore_eos": False,
        "max_tokens": MAX_TOKENS,
        "structured_outputs": CONSTRAINTS[name],
        **options,
    }
    return generate(core, spec_prompts(), **options)


@pytest.fixture(scope="module")
def tokenizer(pair: tuple[Path, Path]) -> Tokenizer:
    return Tokenizer.from_file(str(pair[0] / "tokenizer.json"))


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_constrained_greedy_fits_and_is_lossless_with_either_drafter(
    pair: tuple[Path, Path], tokenizer: Tokenizer, name: str
) -> None:
    target, draft = pair
    base, finishes = constrained(make_core(target), name)
    for out, finish in zip(base, finishes, strict=True):
        # EOS ends it where the grammar is complete: before max_tokens, but for any JSON object (unbounded)
        assert finish == "stop" or name == "json_object", tokenizer.decode(out)
        assert finish != "stop" or fits(name, tokenizer.decode(out[:-1])), tokenizer.decode(out)
    for spec in (DrafterSpec("ngram", K), DrafterSpec("dflash", K, draft)):
        core = make_core(target, speculative=spec)
        assert constrained(core, name)[0] == base, spec.method
        assert core.spec is not None and core.spec.counters.num_drafts > 0, spec.method
        # drafts the grammar allows are accepted (a choice's three strings leave these drafters none)
        assert core.spec.counters.num_accepted_tokens > 0 or name == "choice", spec.method


@pytest.mark.parametrize("name", ["json", "choice"])
def test_sampled_output_with_drafts_fits(pair: tuple[Path, Path], tokenizer: Tokenizer, name: str) -> None:
    target, draft = pair
    core = make_core(target, speculative=DrafterSpec("dflash", K, draft))
    outputs, finishes = constrained(core, name, temperature=1.0)
    for out, finish in zip(outputs, finishes, strict=True):
        assert finish == "stop" and fits(name, tokenizer.decode(out[:-1])), tokenizer.decode(out)


def test_a_grammar_after_the_reasoning_end_token(pair: tuple[Path, Path], tokenizer: Tokenizer) -> None:
    """Output is the unconstrained one up to and including the start token, constrained after it."""
    target, draft = pair
    plain = generate(make_core(target), spec_prompts())[0]
    start = plain[0][3]
    after = StructuredOutputs("choice", json.dumps(CHOICES), start_after_token_id=start)
    for spec in (None, DrafterSpec("dflash", K, draft)):
        outputs = constrained(make_core(target, speculative=spec), "choice", structured_outputs=after)[0]
        cut = outputs[0].index(start) + 1
        assert outputs[0][:cut] == plain[0][:cut]
        assert tokenizer.decode(outputs[0][cut:-1]) in CHOICES


def run_all(core: EngineCore) -> list[EngineCoreOutput]:
    outputs = []
    while core.has_work:
        outputs += core.step()
    return outputs


def test_a_request_waiting_for_its_grammar_holds_up_no_one(pair: tuple[Path, Path]) -> None:
    core = make_core(pair[0])
    busy = threading.Event()
    for _ in range(COMPILE_THREADS):  # the compiler's threads are busy
        core.grammars.compilers._pool.submit(busy.wait, 60)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    core.add_request(
        EngineCoreRequest("waits", [5, 6, 7], SamplingParams(8, structured_outputs=CONSTRAINTS["regex"]))
    )
    core.add_request(EngineCoreRequest("free", [5, 6, 7], params))
    done: dict[str, EngineCoreOutput] = {}
    for _ in range(20):
        done |= {out.request_id: out for out in core.step() if out.finish is not None}
    assert set(done) == {"free"} and core.has_work and len(core.grammars) == 1
    core.add_request(
        EngineCoreRequest("aborted", [5], SamplingParams(8, structured_outputs=CONSTRAINTS["json"]))
    )
    core.abort(["aborted"])
    busy.set()
    done = {out.request_id: out for out in run_all(core) if out.finish is not None}
    assert done["aborted"].finish.kind == "abort" and done["waits"].finish.kind == "stop"  # type: ignore[union-attr]
    assert not core.requests and not core.grammars


def test_a_constraint_that_does_not_compile_is_the_clients_error(pair: tuple[Path, Path]) -> None:
    core = make_core(pair[0])
    bad = StructuredOutputs("json", '{"type": "nonsense"}')
    core.add_request(EngineCoreRequest("bad", [5, 6], SamplingParams(8, structured_outputs=bad)))
    core.add_request(EngineCoreRequest("ok", [5, 6], SamplingParams(3, ignore_eos=True)))
    core.add_request(
        EngineCoreRequest(
            "far",
            [5],
            SamplingParams(3, structured_outputs=StructuredOutputs("regex", "a", start_after_token_id=10**6)),
        )
    )
    ends = {out.request_id: out.finish for out in run_all(core) if out.finish is not None}
    assert ends["ok"] is not None and ends["ok"].kind == "length"
    for request_id, says in (("bad", "json constraint does not compile"), ("far", "start_after_token_id")):
        finish = ends[request_id]
        assert finish is not None and finish.kind == "error" and finish.bad_request
        assert says in (finish.message or ""), finish


def test_a_grammar_that_takes_too_long_ends_its_request(pair: tuple[Path, Path]) -> None:
    """Past the compile timeout the request is refused (the compilation may go on; others are served)."""
    core = make_core(pair[0])
    core.grammars.timeout_s = 0.2
    busy = threading.Event()
    for _ in range(COMPILE_THREADS):
        core.grammars.compilers._pool.submit(busy.wait, 60)
    core.add_request(
        EngineCoreRequest("slow", [5, 6], SamplingParams(8, structured_outputs=CONSTRAINTS["regex"]))
    )
    core.add_request(EngineCoreRequest("free", [5, 6], SamplingParams(3, ignore_eos=True)))
    try:
        ends = {out.request_id: out.finish for out in run_all(core) if out.finish is not None}
    finally:
        busy.set()
    assert ends["free"] is not None and ends["free"].kind == "length"
    slow = ends["slow"]
    assert slow is not None and slow.bad_request and "did not compile within 0.2 s" in (slow.message or "")
