"""What the load runner sends: conversations, each a sequence of turns sent one after the other.

Every dataset but ``multi_turn`` is independent requests, each a conversation of one turn. ``multi_turn``
replays conversations turn by turn: turn n+1 is sent once turn n's reply is in, and carries the whole
exchange so far (every user message and every reply) before its own new user message.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tokenizers import Tokenizer

from openinfer.benchmarks.datasets import DatasetConfig, SampledRequest, read_text, sample_requests
from openinfer.benchmarks.request_client import RequestOutcome
from openinfer.benchmarks.text_windows import TextWindows


@dataclass(frozen=True)
class Conversation:
    """User messages to send one turn at a time, each once the reply to the one before is in."""

    turns: tuple[SampledRequest, ...]  # each turn's new user message, its tokens and the output asked for

    def request(self, replies: Sequence[RequestOutcome]) -> SampledRequest:
        """The next turn after ``replies`` (one per earlier turn): its user message, the exchange so far as its
        history, and as its length the tokens of the messages and of the replies (the server's usage, when
        it answers, replaces this count)."""
        turn = self.turns[len(replies)]
        earlier = list(zip(self.turns, replies, strict=False))
        history = tuple(text for user, reply in earlier for text in (user.prompt, reply.output_text))
        earlier_len = sum(user.prompt_len + reply.output_tokens for user, reply in earlier)
        return replace(turn, prompt_len=earlier_len + turn.prompt_len, history=history)


def multi_turn_conversations(
    text: str,
    tokenizer: Tokenizer,
    num_conversations: int,
    num_turns: int,
    user_len: int,
    output_len: int,
    seed: int,
) -> list[Conversation]:
    """``num_conversations`` conversations of ``num_turns`` user messages, each ``user_len`` consecutive tokens
    of ``text`` at a seeded offset (windows that re-encode to themselves), asking ``output_len`` tokens each.
    The conversations' first messages start with distinct tokens (as far as the text allows), so that no two
    conversations share a prompt prefix: a cache hit is a conversation's own earlier turn."""
    windows = TextWindows(text, tokenizer)
    windows.check_length(user_len)
    rng = random.Random(seed)
    first_starts: set[int] = set()
    conversations = []
    for _ in range(num_conversations):
        first = windows.window(rng, user_len, avoid_first=first_starts)
        first_starts.add(first[0])
        messages = [first] + [windows.window(rng, user_len) for _ in range(num_turns - 1)]
        turns = (SampledRequest(windows.decode(ids), windows.count(ids), output_len) for ids in messages)
        conversations.append(Conversation(tuple(turns)))
    return conversations


def sample_conversations(config: DatasetConfig, tokenizer: Tokenizer) -> list[Conversation]:
    """The workload ``config`` describes: ``multi_turn``'s conversations, or every other dataset's requests as
    conversations of one turn. ``ValueError`` when its file cannot be used."""
    if config.name != "multi_turn":
        return [Conversation((request,)) for request in sample_requests(config, tokenizer)]
    assert config.path is not None  # DatasetConfig.__post_init__
    conversations = multi_turn_conversations(
        read_text(config.path),
        tokenizer,
        config.num_prompts,
        config.multi_turn_num_turns,
        config.multi_turn_user_len,
        config.multi_turn_output_len,
        config.seed,
    )
    if config.max_tokens is None:
        return conversations
    return [
        Conversation(tuple(replace(t, max_tokens=config.max_tokens) for t in c.turns)) for c in conversations
    ]
