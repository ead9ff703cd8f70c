"""--reasoning-parser qwen3: vLLM 0.32's qwen3 splits, whole and streamed at every split point; where the
output starts (the prompt's think block, enable_thinking); the tag scanner under it."""

from __future__ import annotations

import json

import pytest

from openinfer.frontend.openai.parsers.qwen3_reasoning import Qwen3ReasoningParser, ReasoningSplit
from openinfer.frontend.openai.parsers.tag_scanner import Tag, TagScanner
from openinfer.frontend.tokenizer import Tokenizer
from tests.frontend import tiny_tokenizer

# (output, reasoning, content): what vLLM 0.32's qwen3 reasoning parser answers for each output (its
# extract_reasoning, run on Qwen3's tokenizer), thinking on.
VLLM_CASES = [
    ("<think>\nabc\n</think>\n\nHello", "\nabc\n", "\n\nHello"),
    ("abc\n</think>\n\nHello", "abc\n", "\n\nHello"),  # the prompt opened the block
    ("Hello no think", "Hello no think", ""),  # no </think>: all reasoning
    ("<think>unfinished", "unfinished", ""),  # cut by max_tokens
    ("</think>Hello", "", "Hello"),
    ("<think></think>Hello", "", "Hello"),
    ("a</think>b</think>c", "a", "bc"),  # a second </think> is dropped
    ("x<think>y</think>z", "xy", "z"),  # <think> inside reasoning is dropped
    ("a</think>b<think>c</think>d", "a", "b<think>cd"),  # ... but kept in content
    ("<think>a<think>b</think>c", "ab", "c"),
    ("a<tool_call>b</think>c", "a", "<tool_call>bc"),  # a tool call ends the reasoning
    ("a</thi", "a</thi", ""),  # a tag's start at the end is text
    ("", "", ""),
]


def split(parser: Qwen3ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    """(reasoning, content) of the pieces fed in order, then finish."""
    reasoning, content = "", ""
    for piece in pieces:
        part = parser.feed(piece)
        reasoning, content = reasoning + part.reasoning, content + part.content
    end = parser.finish()
    return reasoning + end.reasoning, content + end.content


@pytest.mark.parametrize(("output", "reasoning", "content"), VLLM_CASES)
def test_splits_as_vllm_at_every_split_point(output: str, reasoning: str, content: str) -> None:
    """Whole, in two pieces cut anywhere, and character by character: vLLM's reasoning and content."""
    assert split(Qwen3ReasoningParser(), [output]) == (reasoning, content)
    for cut in range(len(output) + 1):
        assert split(Qwen3ReasoningParser(), [output[:cut], output[cut:]]) == (reasoning, content), cut
    assert split(Qwen3ReasoningParser(), list(output)) == (reasoning, content)


def test_pieces_come_as_soon_as_they_are_known() -> None:
    """Text is released at once, except an end that may start a tag; reasoning comes before content."""
    parser = Qwen3ReasoningParser()
    assert parser.feed("<think>\nhm") == ReasoningSplit("\nhm", "")
    assert parser.feed("m</th") == ReasoningSplit("m", "")  # "</th" may be "</think>"
    assert parser.feed("ink>\n\nHi") == ReasoningSplit("", "\n\nHi")
    assert parser.finish() == ReasoningSplit()


def test_a_prompt_that_closed_the_think_block_starts_in_content() -> None:
    """The last turn of the prompt decides: closed by </think> (content), opened by <think> or neither
    (reasoning); tags before the last turn boundary do not count."""
    tokenizer = _qwen_like_tokenizer()
    ids = {tag: tokenizer.token_id(tag) for tag in ("<think>", "</think>", "<|im_start|>", "<|im_end|>")}
    start, end, turn = ids["<think>"], ids["</think>"], ids["<|im_start|>"]
    text = [5, 6]  # any plain tokens
    cases = [
        ([turn, *text], "reasoning"),  # Qwen3's generation prompt: the model opens the block
        ([turn, *text, start, *text], "reasoning"),  # a template that opens it
        ([turn, *text, start, *text, end, *text], "content"),  # enable_thinking's empty block
        ([start, *text, end, turn, *text], "reasoning"),  # a closed block of an earlier turn
        ([*text], "reasoning"),
    ]
    for prompt, starts_in in cases:
        parser = Qwen3ReasoningParser.for_prompt(tokenizer, prompt, {})
        assert parser is not None
        part = parser.feed("Hi")
        assert ("reasoning" if part.reasoning else "content") == starts_in, prompt


@pytest.mark.parametrize(("kwargs", "parsed"), [({}, True), ({"enable_thinking": True}, True),
                                                ({"enable_thinking": False}, False)])  # fmt: skip
def test_enable_thinking_false_leaves_the_output_untouched(kwargs: dict[str, bool], parsed: bool) -> None:
    """chat_template_kwargs.enable_thinking false: no parser at all (vLLM: all content, as written)."""
    parser = Qwen3ReasoningParser.for_prompt(_qwen_like_tokenizer(), [5], kwargs)
    assert (parser is not None) == parsed


def test_tag_scanner_holds_a_tag_start_until_it_is_known() -> None:
    """Pieces joined are the text fed; a tag split over deltas is one Tag; a false start is text."""
    scanner = TagScanner(("<a>", "<ab>"))
    assert scanner.feed("x<") == ["x"]
    assert scanner.feed("a") == []
    assert scanner.feed("b>y<") == [Tag("<ab>"), "y"]  # the longest tag where two could start
    assert scanner.feed("q") == ["<q"]
    assert scanner.feed("<a") == []
    assert scanner.finish() == ["<a"]
    assert scanner.finish() == []


def _qwen_like_tokenizer() -> Tokenizer:
    """The tiny tokenizer with Qwen3's think and turn tags as added tokens."""
    data = json.loads(tiny_tokenizer.tokenizer_json())
    next_id = max(data["model"]["vocab"].values()) + 1
    for i, tag in enumerate(("<|im_start|>", "<think>", "</think>")):
        data["added_tokens"].append(
            {
                "id": next_id + i,
                "content": tag,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": tag.startswith("<|"),
            }  # fmt: skip
        )
    return Tokenizer(json.dumps(data).encode(), tiny_tokenizer.tokenizer_config_json())
