"""The bench's workloads: ``random``, ``text``, ``prefix_repetition``, ``sharegpt`` and ``jsonl`` prompts, and
``multi_turn`` conversations (``conversations.py``), each picked by a seed.

Every loader returns :class:`SampledRequest` s; the same arguments and seed give the same requests. Prompt
lengths are counted with the bench's tokenizer (the built-in model's unless ``--tokenizer``). A file that
cannot be used raises ``ValueError`` saying why.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tokenizers import Tokenizer

from openinfer.benchmarks.text_windows import TextWindows
from openinfer.benchmarks.vocabulary import text_token_ids

DATASET_NAMES = ("random", "text", "prefix_repetition", "multi_turn", "sharegpt", "jsonl")
# The datasets that cut their prompts from any text file: the built-in tinyshakespeare unless given another.
TEXT_DATASETS = ("text", "prefix_repetition", "multi_turn")
# ShareGPT filtering as vLLM's benchmark does it: a conversation is skipped when its prompt or reply is
# shorter than this many tokens, the prompt is longer than SHAREGPT_MAX_PROMPT, or both longer than
# SHAREGPT_MAX_TOTAL.
SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_PROMPT = 1024
SHAREGPT_MAX_TOTAL = 2048

T = TypeVar("T")


@dataclass(frozen=True)
class SampledRequest:
    """One request to send: its prompt text, its length in tokens and the output length asked for.

    A later turn of a conversation also carries the messages before ``prompt`` (user and assistant in turn,
    starting with the user's); ``prompt_len`` counts them too. Chat sends them as messages, completions as
    one text: ``"".join(history) + prompt``.
    """

    prompt: str
    prompt_len: int
    max_tokens: int
    history: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetConfig:
    """Which workload, how many requests and their lengths (the ``--dataset-*``, ``--random-*``, ``--text-*``
    flags)."""

    name: str  # one of DATASET_NAMES
    path: Path | None  # the file for every dataset but random
    num_prompts: int
    seed: int
    random_input_len: int = 64
    random_output_len: int = 64
    random_range_ratio: float = 0.0  # random lengths vary by up to this fraction either way
    text_input_len: int = 64
    text_output_len: int = 64
    prefix_repetition_prefix_len: int = 256  # tokens of each shared prefix (vLLM's defaults, these four)
    prefix_repetition_suffix_len: int = 256  # tokens after it, a window of its own per request
    prefix_repetition_num_prefixes: int = 10  # distinct prefixes; num_prompts // this requests share each
    prefix_repetition_output_len: int = 128
    multi_turn_num_turns: int = 4  # requests per conversation; num_prompts is the number of conversations
    multi_turn_user_len: int = 64  # tokens of each user message
    multi_turn_output_len: int = 64  # output tokens asked for per turn
    max_tokens: int | None = None  # every request's output length, over the dataset's own

    def __post_init__(self) -> None:
        if self.name not in DATASET_NAMES:
            raise ValueError(f"unknown dataset {self.name!r}: use one of {', '.join(DATASET_NAMES)}")
        if self.name != "random" and self.path is None:
            raise ValueError(f"the {self.name} dataset needs --dataset-path")
        if self.num_prompts < 1 or min(self.random_input_len, self.random_output_len) < 1:
            raise ValueError("--num-prompts and the --random-*-len lengths must be positive")
        if min(self.text_input_len, self.text_output_len) < 1 or (self.max_tokens or 1) < 1:
            raise ValueError("--text-*-len and --max-tokens must be positive")
        if not 0 <= self.random_range_ratio < 1:
            raise ValueError("--random-range-ratio must be in [0, 1)")
        prefix_lens = (self.prefix_repetition_prefix_len, self.prefix_repetition_output_len)
        if min(prefix_lens) < 1 or self.prefix_repetition_suffix_len < 0:
            raise ValueError(
                "--prefix-repetition-prefix-len and -output-len must be positive, -suffix-len >= 0"
            )
        if (
            self.name == "prefix_repetition"
            and not 1 <= self.prefix_repetition_num_prefixes <= self.num_prompts
        ):
            raise ValueError("--prefix-repetition-num-prefixes must be in [1, --num-prompts]")
        if min(self.multi_turn_num_turns, self.multi_turn_user_len, self.multi_turn_output_len) < 1:
            raise ValueError("--multi-turn-num-turns, -user-len and -output-len must be positive")

    def describe(self) -> str:
        """The dataset as the report names it, e.g. "text (tinyshakespeare.txt)"."""
        return self.name if self.path is None else f"{self.name} ({self.path.name})"


def sample_requests(config: DatasetConfig, tokenizer: Tokenizer) -> list[SampledRequest]:
    """The requests ``config`` describes; ``ValueError`` when its file cannot be used."""
    if config.name == "random":
        requests = random_requests(
            tokenizer,
            config.num_prompts,
            config.random_input_len,
            config.random_output_len,
            config.random_range_ratio,
            config.seed,
        )
    elif config.name == "text":
        assert config.path is not None  # __post_init__
        text = read_text(config.path)
        requests = text_requests(
            text, tokenizer, config.num_prompts, config.text_input_len, config.text_output_len, config.seed
        )
    elif config.name == "prefix_repetition":
        assert config.path is not None
        requests = prefix_repetition_requests(
            read_text(config.path),
            tokenizer,
            config.num_prompts,
            config.prefix_repetition_prefix_len,
            config.prefix_repetition_suffix_len,
            config.prefix_repetition_num_prefixes,
            config.prefix_repetition_output_len,
            config.seed,
        )
    elif config.name == "multi_turn":
        raise ValueError(
            "multi_turn is a workload of conversations: conversations.sample_conversations builds it"
        )
    elif config.name == "sharegpt":
        assert config.path is not None
        requests = sharegpt_requests(config.path, tokenizer, config.num_prompts, None, config.seed)
    else:
        assert config.path is not None
        requests = jsonl_requests(config.path, tokenizer, config.num_prompts, config.max_tokens, config.seed)
    if config.max_tokens is None:
        return requests
    return [SampledRequest(r.prompt, r.prompt_len, config.max_tokens) for r in requests]


def random_requests(
    tokenizer: Tokenizer,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
) -> list[SampledRequest]:
    """Prompts of token ids drawn uniformly from the tokenizer's text tokens (``text_token_ids``), decoded.

    Lengths are drawn uniformly from ``[len * (1 - range_ratio), len * (1 + range_ratio)]`` (vLLM's rule),
    at least 1. A server re-encodes the text, so its prompt length can differ by a few tokens.
    """
    vocab = text_token_ids(tokenizer)
    rng = random.Random(seed)
    requests = []
    for _ in range(num_prompts):
        prompt_len = _draw_len(rng, input_len, range_ratio)
        ids = [rng.choice(vocab) for _ in range(prompt_len)]
        requests.append(
            SampledRequest(tokenizer.decode(ids), prompt_len, _draw_len(rng, output_len, range_ratio))
        )
    return requests


def text_requests(
    text: str, tokenizer: Tokenizer, num_prompts: int, input_len: int, output_len: int, seed: int
) -> list[SampledRequest]:
    """Prompts of ``input_len`` consecutive tokens of ``text``, at seeded random token offsets (windows that
    re-encode to themselves: ``TextWindows``)."""
    windows = TextWindows(text, tokenizer)
    windows.check_length(input_len)
    rng = random.Random(seed)
    requests = []
    for _ in range(num_prompts):
        ids = windows.window(rng, input_len)
        requests.append(SampledRequest(windows.decode(ids), windows.count(ids), output_len))
    return requests


def prefix_repetition_requests(
    text: str,
    tokenizer: Tokenizer,
    num_prompts: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    output_len: int,
    seed: int,
) -> list[SampledRequest]:
    """vLLM's ``prefix_repetition`` cut from prose: ``num_prefixes`` prefixes of ``prefix_len`` tokens of
    ``text``, each followed in ``num_prompts // num_prefixes`` requests (vLLM's count: the remainder is not
    sent) by a ``suffix_len``-token window of its own, all in a seeded shuffled order.

    Windows are drawn at seeded offsets (``TextWindows``) so that prefix + suffix re-encodes to exactly its
    ids, the prefixes start with distinct tokens and so do the suffixes of each prefix: every prompt is then
    ``prefix_len + suffix_len`` tokens, those of one prefix share exactly its ``prefix_len`` ids and those of
    two prefixes none (a text too short or too repetitive for that is used as it is). ``prompt_len`` is the
    prompt re-encoded with the bench tokenizer either way.
    """
    if num_prompts < num_prefixes:
        raise ValueError(f"--num-prompts {num_prompts} is fewer than --prefix-repetition-num-prefixes")
    windows = TextWindows(text, tokenizer)
    windows.check_length(max(prefix_len, suffix_len))
    rng = random.Random(seed)
    requests = []
    prefix_starts: set[int] = set()
    for _ in range(num_prefixes):
        prefix = windows.window(rng, prefix_len, avoid_first=prefix_starts)
        prefix_starts.add(prefix[0])
        suffix_starts: set[int] = set()
        for _ in range(num_prompts // num_prefixes):
            suffix = windows.window(rng, suffix_len, after=prefix, avoid_first=suffix_starts)
            suffix_starts.update(suffix[:1])
            ids = prefix + suffix
            requests.append(SampledRequest(windows.decode(ids), windows.count(ids), output_len))
    rng.shuffle(requests)
    return requests


def sharegpt_requests(
    path: Path, tokenizer: Tokenizer, num_prompts: int, output_len: int | None, seed: int
) -> list[SampledRequest]:
    """ShareGPT conversations: the first human turn is the prompt, the reply's length the output length.

    ``output_len`` given: every request asks for that many tokens instead.
    """
    conversations = _read_json(path)
    if not isinstance(conversations, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of {{'conversations': [...]}} entries")
    usable = []
    for entry in conversations:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(reply, dict)) or first.get("from") != "human":
            continue
        prompt, answer = first.get("value"), reply.get("value")
        if isinstance(prompt, str) and isinstance(answer, str):
            usable.append((prompt, answer))
    requests = []
    for prompt, answer in _shuffled(usable, random.Random(seed)):
        prompt_len, reply_len = len(tokenizer.encode(prompt).ids), len(tokenizer.encode(answer).ids)
        if min(prompt_len, reply_len) < SHAREGPT_MIN_LEN or prompt_len > SHAREGPT_MAX_PROMPT:
            continue
        if prompt_len + reply_len > SHAREGPT_MAX_TOTAL:
            continue
        requests.append(SampledRequest(prompt, prompt_len, output_len or reply_len))
        if len(requests) == num_prompts:
            break
    return _cycled(requests, num_prompts, f"{path}: no conversation with a human prompt and a reply")


def jsonl_requests(
    path: Path, tokenizer: Tokenizer, num_prompts: int, default_max_tokens: int | None, seed: int
) -> list[SampledRequest]:
    """One ``{"prompt": str, "max_tokens": int}`` object per line (e.g. code tasks); blank lines skipped.

    A line without ``max_tokens`` takes ``default_max_tokens`` (``--max-tokens``).
    """
    entries = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e})") from e
        prompt = entry.get("prompt") if isinstance(entry, dict) else None
        max_tokens = entry.get("max_tokens", default_max_tokens) if isinstance(entry, dict) else None
        if not isinstance(prompt, str):
            raise ValueError(f'{path}:{number}: each line is {{"prompt": "...", "max_tokens": N}}')
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"{path}:{number}: max_tokens must be a positive integer (or pass --max-tokens)")
        entries.append(SampledRequest(prompt, len(tokenizer.encode(prompt).ids), max_tokens))
    picked = _shuffled(entries, random.Random(seed))[:num_prompts]
    return _cycled(picked, num_prompts, f"{path}: no prompt in the file")


def _draw_len(rng: random.Random, length: int, range_ratio: float) -> int:
    low, high = int(length * (1 - range_ratio)), int(length * (1 + range_ratio))
    return max(1, rng.randint(low, max(low, high)))


def _shuffled(items: Sequence[T], rng: random.Random) -> list[T]:
    shuffled = list(items)
    rng.shuffle(shuffled)
    return shuffled


def _cycled(items: list[T], count: int, empty_error: str) -> list[T]:
    """``count`` items: these, repeated in order when there are fewer (as vLLM oversamples)."""
    if not items:
        raise ValueError(empty_error)
    return [items[i % len(items)] for i in range(count)]


def read_text(path: Path) -> str:
    """A dataset file's text; ``ValueError`` saying why when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the dataset {path}: {e}") from e


def _read_json(path: Path) -> object:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from e
