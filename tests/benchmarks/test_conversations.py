"""multi_turn: conversations cut from a text, each turn carrying the exchange so far, sent only after the
previous turn's reply is in, conversations side by side up to the concurrency cap."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

import aiohttp

from openinfer.benchmarks.conversations import Conversation, multi_turn_conversations, sample_conversations
from openinfer.benchmarks.datasets import DatasetConfig, SampledRequest
from openinfer.benchmarks.load_runner import NOT_SENT, run_conversations
from openinfer.benchmarks.request_client import RequestOutcome, SamplingConfig, request_body
from openinfer.benchmarks.vocabulary import load_tokenizer
from tests.benchmarks.openai_fake import FAIL_WORD, REPLY, FakeServer
from tests.benchmarks.texts import SONNETS


def test_multi_turn_user_messages_are_seeded_windows_of_the_text() -> None:
    """3 conversations of 2 turns: user messages of exactly 12 tokens cut from the text, 5 output tokens each;
    the first messages part at their first token; the same seed the same conversations, another others."""
    tokenizer = load_tokenizer()
    conversations = multi_turn_conversations(SONNETS, tokenizer, 3, 2, user_len=12, output_len=5, seed=0)
    assert [len(c.turns) for c in conversations] == [2, 2, 2]
    for turn in (t for c in conversations for t in c.turns):
        assert turn.prompt in SONNETS and turn.history == ()  # byte-level BPE decodes a window back exactly
        assert (turn.prompt_len, turn.max_tokens, len(tokenizer.encode(turn.prompt).ids)) == (12, 5, 12)
    assert len({tokenizer.encode(c.turns[0].prompt).ids[0] for c in conversations}) == 3
    assert conversations == multi_turn_conversations(SONNETS, tokenizer, 3, 2, 12, 5, seed=0)
    assert conversations != multi_turn_conversations(SONNETS, tokenizer, 3, 2, 12, 5, seed=1)


def test_sample_conversations_from_flags(sonnets_path: Path) -> None:
    """--dataset-name multi_turn: --num-prompts conversations of --multi-turn-num-turns turns (--max-tokens
    over the output length); every other dataset: its requests as one-turn conversations."""
    tokenizer = load_tokenizer()
    lengths = {"multi_turn_num_turns": 3, "multi_turn_user_len": 8, "max_tokens": 2}
    multi = sample_conversations(DatasetConfig("multi_turn", sonnets_path, 4, 0, **lengths), tokenizer)
    assert [[(t.prompt_len, t.max_tokens) for t in c.turns] for c in multi] == [[(8, 2)] * 3] * 4
    text = sample_conversations(DatasetConfig("text", sonnets_path, 2, 0, text_input_len=6), tokenizer)
    assert [[t.prompt_len for t in c.turns] for c in text] == [[6], [6]]


def outcome(text: str, tokens: int) -> RequestOutcome:
    return RequestOutcome(prompt_len=0, output_tokens=tokens, ttft=0.1, e2e=0.2, output_text=text)


def test_next_turn_carries_the_exchange_so_far() -> None:
    """Turn 3 after two replies: its history is user 1, reply 1, user 2, reply 2; its length their tokens and
    its own; completions send it all as one text, chat as alternating messages."""
    turns = tuple(SampledRequest(f"<user {i}>", 10, 4) for i in (1, 2, 3))
    third = Conversation(turns).request([outcome("<reply 1>", 4), outcome("<reply 2>", 3)])
    assert third.history == ("<user 1>", "<reply 1>", "<user 2>", "<reply 2>")
    assert (third.prompt, third.prompt_len, third.max_tokens) == ("<user 3>", 10 + 4 + 10 + 3 + 10, 4)
    completions = request_body(third, SamplingConfig("m", "completions", 0.0, False))
    assert completions["prompt"] == "<user 1><reply 1><user 2><reply 2><user 3>"
    chat = request_body(third, SamplingConfig("m", "chat", 0.0, False))
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [
        ("user", "<user 1>"),
        ("assistant", "<reply 1>"),
        ("user", "<user 2>"),
        ("assistant", "<reply 2>"),
        ("user", "<user 3>"),
    ]


def conversation(name: str, num_turns: int) -> Conversation:
    return Conversation(tuple(SampledRequest(f"<{name}{i}>", 2, 3) for i in range(num_turns)))


async def test_turns_wait_for_the_previous_reply(fake: tuple[FakeServer, str]) -> None:
    """Two 3-turn conversations, unbounded: each turn is sent after the previous one's stream ended, with
    its prompt + the reply + the new message as its prompt; the two conversations run side by side."""
    server, url = fake
    sampling = SamplingConfig("m", "completions", 0.0, False)
    async with aiohttp.ClientSession() as session:
        report = await run_conversations(
            session, url, [conversation("a", 3), conversation("b", 3)], sampling, None, math.inf, 0, False
        )
    assert len(report.ok) == 6 and [o.output_text for o in report.outcomes] == [REPLY] * 6
    for name in "ab":
        turns = [r for r in server.received if r.text.startswith(f"<{name}0>")]
        assert [r.text for r in turns] == [
            f"<{name}0>",
            f"<{name}0>{REPLY}<{name}1>",
            f"<{name}0>{REPLY}<{name}1>{REPLY}<{name}2>",
        ]
        assert all(later.started >= earlier.finished for earlier, later in pairwise(turns))
    assert server.max_in_flight() == 2  # one turn of each conversation at a time, the two side by side


async def test_concurrency_caps_conversations(fake: tuple[FakeServer, str]) -> None:
    """--max-concurrency 1: a conversation holds its slot through its last turn, so b starts after a ends."""
    server, url = fake
    sampling = SamplingConfig("m", "chat", 0.0, False)
    async with aiohttp.ClientSession() as session:
        report = await run_conversations(
            session, url, [conversation("a", 2), conversation("b", 2)], sampling, 1, math.inf, 0, False
        )
    assert len(report.ok) == 4
    assert [r.body["messages"][0]["content"] for r in server.received] == ["<a0>", "<a0>", "<b0>", "<b0>"]
    assert server.received[2].started >= server.received[1].finished


async def test_a_failed_turn_ends_its_conversation(fake: tuple[FakeServer, str]) -> None:
    """A turn that fails is reported; the turns after it are not sent and fail as not sent; other
    conversations go on."""
    server, url = fake
    failing = Conversation(tuple(SampledRequest(text, 2, 3) for text in ("<c0>", FAIL_WORD, "<c2>", "<c3>")))
    sampling = SamplingConfig("m", "completions", 0.0, False)
    async with aiohttp.ClientSession() as session:
        report = await run_conversations(
            session, url, [failing, conversation("d", 2)], sampling, None, math.inf, 0, False
        )
    assert len(server.received) == 4  # c0, the failing turn, d0, d1
    assert [o.error is None for o in report.outcomes] == [True, False, False, False, True, True]
    assert report.errors[NOT_SENT] == 2 and sum(report.errors.values()) == 3
