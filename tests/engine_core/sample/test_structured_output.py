"""xgrammar constraints on the built-in tokenizer: whatever the logits, the masked greedy walk gives text the
constraint accepts; the masks of a draft run are the ones a matcher stepping token by token gives."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch
from tokenizers import Tokenizer

from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.sample.structured_output import (
    COMPILE_THREADS,
    GrammarCompilers,
    RequestGrammar,
    allocate_masks,
    apply_masks,
    tokenizer_info,
)
from openinfer.protocol import StructuredOutputs

VOCAB = 512
EOS = 0
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compilers() -> GrammarCompilers:
    return GrammarCompilers(builtin_target_folder() / "tokenizer.json", VOCAB, [EOS])


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(builtin_target_folder() / "tokenizer.json"))


def masks(grammar: RequestGrammar, drafts: list[int]) -> torch.Tensor:
    rows = allocate_masks(len(drafts) + 1, VOCAB)
    grammar.fill(rows, 0, drafts)
    return rows


def constrained_greedy(compilers: GrammarCompilers, kind: str, spec: str, seed: int) -> list[int]:
    """Greedy over random logits under the constraint, until it accepts the stop token."""
    constraint = StructuredOutputs(kind, spec)  # type: ignore[arg-type]
    grammar = RequestGrammar(compilers.compile(constraint).result(timeout=60))
    generator = torch.Generator().manual_seed(seed)
    tokens: list[int] = []
    while not grammar.is_terminated and len(tokens) < 200:
        logits = torch.randn(1, VOCAB, generator=generator)
        apply_masks(logits, masks(grammar, []))
        token = int(logits.argmax())
        assert grammar.advance([token])
        tokens.append(token)
    assert grammar.is_terminated and tokens[-1] == EOS
    return tokens[:-1]


@pytest.mark.parametrize("seed", range(5))
def test_json_schema_output_always_fits(compilers: GrammarCompilers, tokenizer: Tokenizer, seed: int) -> None:
    # strict=False: xgrammar's JSON strings may hold raw control characters (as vLLM's output may).
    text = tokenizer.decode(constrained_greedy(compilers, "json", json.dumps(SCHEMA), seed))
    value = json.loads(text, strict=False)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 8


def test_regex_choice_and_any_json(compilers: GrammarCompilers, tokenizer: Tokenizer) -> None:
    assert re.fullmatch(
        r"[0-9]{3}-[a-z]{2}", tokenizer.decode(constrained_greedy(compilers, "regex", "[0-9]{3}-[a-z]{2}", 1))
    )
    choices = ["thou", "art", "ROMEO"]
    assert tokenizer.decode(constrained_greedy(compilers, "choice", json.dumps(choices), 2)) in choices
    any_json = tokenizer.decode(constrained_greedy(compilers, "json_object", "", 3))
    assert isinstance(json.loads(any_json, strict=False), dict)


def test_draft_masks_step_through_the_run_and_stop_at_a_refused_draft(
    compilers: GrammarCompilers, tokenizer: Tokenizer
) -> None:
    compiled = compilers.compile(StructuredOutputs("json", json.dumps(SCHEMA))).result(timeout=60)
    text = '{"name": "ab", "age": 7}'
    ids = tokenizer.encode(text).ids
    grammar, stepper = RequestGrammar(compiled), RequestGrammar(compiled)
    assert grammar.advance(ids[:2]) and stepper.advance(ids[:2])
    refused = tokenizer.encode("]").ids[0]
    drafts = [*ids[2:5], refused, ids[5]]
    rows = allocate_masks(2 + len(drafts), VOCAB)  # one row before the request's, as in a step
    assert grammar.fill(rows, 1, drafts) == [1, 2, 3, 4]
    assert torch.equal(rows[1:], masks(grammar, drafts))  # the matcher ended where it began
    for i in range(4):  # rows 0..3 of the request: after the tokens and drafts[:i]
        assert torch.equal(rows[1 + i], masks(stepper, [])[0])
        if i < 3:
            assert stepper.advance([drafts[i]])
    assert (rows[0] == -1).all() and (rows[5] == -1).all()  # not its row; past the refused draft
    logits = torch.zeros(6, VOCAB)
    apply_masks(logits, rows, [4])
    assert logits[4, refused] == float("-inf") and logits[4, ids[5]] == 0
    assert (logits[[0, 1, 2, 3, 5]] == 0).all()
    assert not stepper.advance([refused])  # a token the grammar refuses is said so, not taken
    assert grammar.advance(ids[2:])  # what verification kept is accepted for good
    assert grammar.advance([EOS]) and grammar.is_terminated
    assert grammar.fill(allocate_masks(1, VOCAB), 0, []) == []  # ended: nothing left to constrain


def test_a_grammar_that_starts_after_a_token(compilers: GrammarCompilers, tokenizer: Tokenizer) -> None:
    """Free until the start token (a reasoning parser's </think>), then constrained, drafts included."""
    compiled = compilers.compile(StructuredOutputs("regex", "[0-9]+")).result(timeout=60)
    start = tokenizer.encode("ROMEO").ids[0]
    digit, letter = tokenizer.encode("7").ids[0], tokenizer.encode("a").ids[0]
    grammar = RequestGrammar(compiled, start_after_token_id=start)
    assert grammar.advance([letter, letter])  # free text
    rows = allocate_masks(4, VOCAB)
    assert grammar.fill(rows, 0, [letter, start, digit]) == [2, 3]
    assert grammar.fill(rows, 0, [letter, start, letter]) == [2]  # the letter after it is refused at row 2
    assert grammar.advance([start, digit]) and not grammar.advance([letter])


def test_special_tokens_are_never_text() -> None:
    info = tokenizer_info(builtin_target_folder() / "tokenizer.json", VOCAB, [EOS])
    assert set(info.special_token_ids) >= {1, 2}  # <|im_start|>, <|im_end|>


def test_compilations_are_shared_and_bad_constraints_say_why(compilers: GrammarCompilers) -> None:
    regex = StructuredOutputs("regex", "[ab]+")
    busy = threading.Event()
    for _ in range(COMPILE_THREADS):  # the compiler's threads are busy: both calls find it in flight
        compilers._pool.submit(busy.wait, 60)
    first = compilers.compile(regex)
    assert first is compilers.compile(StructuredOutputs("regex", "[ab]+", start_after_token_id=5))
    busy.set()
    first.result(timeout=60)
    with pytest.raises(ValueError, match="json constraint does not compile"):
        compilers.compile(StructuredOutputs("json", '{"type": "nonsense"}')).result(timeout=60)
    with pytest.raises(ValueError, match="grammar constraint does not compile"):
        compilers.compile(StructuredOutputs("grammar", "root ::= (")).result(timeout=60)
    with pytest.raises(ValueError, match="choice constraint does not compile"):
        compilers.compile(StructuredOutputs("choice", "[]")).result(timeout=60)
