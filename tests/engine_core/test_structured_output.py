"""xgrammar constraints on the built-in tokenizer: whatever the logits, the masked greedy walk gives text the
constraint accepts; the masks of a draft run are the ones a matcher stepping token by token gives."""

from __future__ import annotations

import json
import re

import pytest
import torch
from tokenizers import Tokenizer

from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.structured_output import GrammarCompilers, RequestGrammar, apply_masks

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


def constrained_greedy(compilers: GrammarCompilers, kind: str, spec: str, seed: int) -> list[int]:
    """Greedy over random logits under the constraint, until it accepts the stop token."""
    grammar = RequestGrammar(compilers.compile(kind, spec).result(timeout=60), VOCAB)  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed)
    tokens: list[int] = []
    while not grammar.is_terminated and len(tokens) < 200:
        logits = torch.randn(1, VOCAB, generator=generator)
        apply_masks(logits, grammar.masks([]))
        token = int(logits.argmax())
        grammar.advance([token])
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
    compiled = compilers.compile("json", json.dumps(SCHEMA)).result(timeout=60)
    text = '{"name": "ab", "age": 7}'
    ids = tokenizer.encode(text).ids
    grammar, stepper = RequestGrammar(compiled, VOCAB), RequestGrammar(compiled, VOCAB)
    grammar.advance(ids[:2])
    stepper.advance(ids[:2])
    refused = tokenizer.encode("]").ids[0]
    drafts = [*ids[2:5], refused, ids[5]]
    masks = grammar.masks(drafts)
    assert torch.equal(masks, grammar.masks(drafts))  # the matcher ended where it began
    for i in range(4):  # rows 0..3: after the tokens and drafts[:i]
        assert torch.equal(masks[i], stepper.masks([])[0])
        if i < 3:
            stepper.advance([drafts[i]])
    assert torch.equal(masks[4], masks[3])  # past the refused draft: its row again
    logits = torch.zeros(1, VOCAB)
    apply_masks(logits, masks[3:4])
    assert logits[0, refused] == float("-inf") and logits[0, ids[5]] == 0
    grammar.advance(ids[2:])  # what verification kept is accepted for good
    grammar.advance([EOS])
    assert grammar.is_terminated


def test_special_tokens_are_never_text(compilers: GrammarCompilers) -> None:
    assert set(compilers.info.special_token_ids) >= {1, 2}  # <|im_start|>, <|im_end|>


def test_compilations_are_shared_and_bad_constraints_say_why(compilers: GrammarCompilers) -> None:
    assert compilers.compile("regex", "[ab]+") is compilers.compile("regex", "[ab]+")
    with pytest.raises(ValueError, match="json constraint does not compile"):
        compilers.compile("json", '{"type": "nonsense"}').result(timeout=60)
    with pytest.raises(ValueError, match="grammar constraint does not compile"):
        compilers.compile("grammar", "root ::= (").result(timeout=60)
