"""The bench's dataset loaders on small files written here, and the tokenizer's text vocabulary."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from openinfer.benchmarks.datasets import (
    DatasetConfig,
    SampledRequest,
    jsonl_requests,
    prefix_repetition_requests,
    random_requests,
    sample_requests,
    sharegpt_requests,
    text_requests,
)
from openinfer.benchmarks.text_windows import TextWindows
from openinfer.benchmarks.vocabulary import load_tokenizer, text_token_ids
from tests.benchmarks.texts import SONNETS, WORDS

HAMLET = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 4


def conversation(*turns: tuple[str, str]) -> dict[str, object]:
    """One ShareGPT entry from (speaker, text) turns."""
    return {"conversations": [{"from": speaker, "value": text} for speaker, text in turns]}


def test_text_token_ids_leave_out_special_and_partial_tokens() -> None:
    """The built-in vocabulary minus its 3 special tokens and the byte tokens that are not text on their own."""
    tokenizer = load_tokenizer()
    ids = text_token_ids(tokenizer)
    assert not {0, 1, 2} & set(ids)  # <|endoftext|>, <|im_start|>, <|im_end|>
    assert 300 < len(ids) < 509  # most of the 512, less the high bytes (half a UTF-8 character)
    for i in ids:
        text = tokenizer.decode([i])
        assert text and "\ufffd" not in text and all(c.isprintable() or c in " \n\t" for c in text)


def test_random_prompts_are_vocabulary_words(word_tokenizer_path: Path) -> None:
    """Random prompts decode from real vocabulary tokens (never the special ones), input_len of them."""
    tokenizer = load_tokenizer(word_tokenizer_path)
    requests = random_requests(tokenizer, 5, input_len=12, output_len=7, range_ratio=0.0, seed=1)
    assert [(r.prompt_len, r.max_tokens) for r in requests] == [(12, 7)] * 5
    for request in requests:
        words = request.prompt.split(" ")
        assert len(words) == 12  # word-level: one token, one word
        assert set(words) <= set(WORDS[2:])  # not [UNK] or <eos>
    assert len({r.prompt for r in requests}) == 5


def test_random_prompts_of_the_builtin_tokenizer_are_text() -> None:
    """Built-in vocabulary: prompts re-encode to text tokens only, not to consecutive ids or special tokens."""
    tokenizer = load_tokenizer()
    allowed = set(text_token_ids(tokenizer))
    for request in random_requests(tokenizer, 4, input_len=32, output_len=8, range_ratio=0.0, seed=0):
        ids = tokenizer.encode(request.prompt).ids
        assert set(ids) <= allowed
        assert ids != list(range(ids[0], ids[0] + len(ids)))
        assert 28 <= len(ids) <= 36  # re-encoding merges or splits a few neighbours (64 tokens: 63..67 seen)


def test_random_lengths_vary_within_the_range_ratio(word_tokenizer_path: Path) -> None:
    """--random-range-ratio 0.5 draws lengths in [len / 2, 3 len / 2]."""
    tokenizer = load_tokenizer(word_tokenizer_path)
    requests = random_requests(tokenizer, 20, input_len=10, output_len=10, range_ratio=0.5, seed=3)
    assert all(5 <= r.prompt_len <= 15 and 5 <= r.max_tokens <= 15 for r in requests)
    assert len({r.prompt_len for r in requests}) > 1


def test_text_prompts_are_cut_from_the_file() -> None:
    """Text prompts are input_len consecutive tokens of the file (byte-level BPE decodes them back exactly)."""
    tokenizer = load_tokenizer()
    requests = text_requests(HAMLET, tokenizer, 6, input_len=10, output_len=5, seed=2)
    for request in requests:
        assert request.prompt in HAMLET
        assert (request.prompt_len, request.max_tokens) == (10, 5)
        assert len(tokenizer.encode(request.prompt).ids) <= 10


def common_prefix_len(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def is_window(ids: list[int], of: list[int]) -> bool:
    return any(of[i : i + len(ids)] == ids for i in range(len(of) - len(ids) + 1))


def test_prefix_repetition_shares_exactly_the_prefix() -> None:
    """10 prompts over 3 prefixes: 3 per prefix (vLLM's 10 // 3; the remainder is not sent), each 48 prefix
    + 16 suffix tokens as the server re-encodes them; one prefix's prompts share exactly its 48 tokens, two
    prefixes' prompts not even their first; every part is a window of the text; the order is shuffled."""
    tokenizer = load_tokenizer()
    text_ids = tokenizer.encode(SONNETS).ids
    requests = prefix_repetition_requests(SONNETS, tokenizer, 10, 48, 16, 3, output_len=5, seed=0)
    assert [(r.prompt_len, r.max_tokens) for r in requests] == [(64, 5)] * 9
    prompts = [tokenizer.encode(r.prompt).ids for r in requests]
    assert all(len(ids) == 64 for ids in prompts)  # prefix + suffix re-encode to themselves
    groups: dict[tuple[int, ...], list[list[int]]] = {}
    for ids in prompts:
        groups.setdefault(tuple(ids[:48]), []).append(ids)
    assert sorted(len(g) for g in groups.values()) == [3, 3, 3]
    for group in groups.values():
        assert {common_prefix_len(a, b) for a in group for b in group if a is not b} == {48}
    assert len({prefix[0] for prefix in groups}) == 3  # prefixes part at their first token
    assert all(
        is_window(list(p), text_ids) and is_window(ids[48:], text_ids) for p, g in groups.items() for ids in g
    )
    order = [list(groups).index(tuple(ids[:48])) for ids in prompts]
    assert order != sorted(order)  # shuffled, not prefix by prefix


def test_prefix_repetition_suffix_len_zero_repeats_whole_prompts() -> None:
    """No suffix: each prefix's requests are the same prompt (the whole prompt cached after the first)."""
    requests = prefix_repetition_requests(SONNETS, load_tokenizer(), 4, 20, 0, 2, output_len=3, seed=1)
    assert len({r.prompt for r in requests}) == 2 and [r.prompt_len for r in requests] == [20] * 4


def test_prefix_repetition_refuses_fewer_prompts_than_prefixes(tmp_path: Path) -> None:
    """Fewer --num-prompts than prefixes is refused (vLLM's rule), and so is a text shorter than a prefix."""
    with pytest.raises(ValueError, match="num-prefixes must be in"):
        DatasetConfig("prefix_repetition", tmp_path, num_prompts=3, seed=0, prefix_repetition_num_prefixes=4)
    with pytest.raises(ValueError, match="too few"):
        prefix_repetition_requests("to be", load_tokenizer(), 4, 64, 8, 2, output_len=3, seed=0)


def test_windows_round_trip_after_what_precedes_them() -> None:
    """A window drawn after a prefix re-encodes with it to exactly prefix + window; a lone window that
    round-trips at once is the text_requests draw (one randrange)."""
    windows = TextWindows(SONNETS, load_tokenizer())
    rng = random.Random(0)
    prefix = windows.window(rng, 40)
    for _ in range(50):
        ids = prefix + windows.window(rng, 9, after=prefix)
        assert windows.tokenizer.encode(windows.decode(ids)).ids == ids
    start = random.Random(3).randrange(0, len(windows.ids) - 12 + 1)
    assert windows.window(random.Random(3), 12) == windows.ids[start : start + 12]


def test_text_too_short_is_refused() -> None:
    """A file with fewer tokens than a prompt needs says so."""
    with pytest.raises(ValueError, match="too few"):
        text_requests("to be", load_tokenizer(), 1, input_len=64, output_len=5, seed=0)


def test_sharegpt_takes_first_human_turn_and_reply_length(tmp_path: Path, word_tokenizer_path: Path) -> None:
    """ShareGPT: the first human turn is the prompt, the reply's token count the output length; conversations
    that start with the model, lack a reply, or are too short (< 4 tokens) are skipped."""
    conversations = [
        conversation(("human", "to be or not to be"), ("gpt", "that is the question")),
        conversation(("gpt", "to be or not"), ("human", "that is the question")),
        conversation(("human", "that is the question")),
        conversation(("human", "to be"), ("gpt", "or not to be")),
        conversation(("human", "is that the question"), ("gpt", "to be or not to be")),
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    tokenizer = load_tokenizer(word_tokenizer_path)
    requests = sharegpt_requests(path, tokenizer, 2, output_len=None, seed=0)
    assert sorted(requests, key=lambda r: r.prompt) == [
        SampledRequest("is that the question", 4, 6),  # "to be or not to be": 6 words
        SampledRequest("to be or not to be", 6, 4),
    ]
    # Asked for more than there are: the usable ones again, in the same order.
    assert sharegpt_requests(path, tokenizer, 5, output_len=3, seed=0)[2:4] == [
        SampledRequest(r.prompt, r.prompt_len, 3) for r in requests
    ]


def test_jsonl_prompts_and_max_tokens(tmp_path: Path, word_tokenizer_path: Path) -> None:
    """jsonl: one {"prompt", "max_tokens"} per line; a missing max_tokens takes --max-tokens, else an error."""
    path = tmp_path / "code.jsonl"
    path.write_text('{"prompt": "to be", "max_tokens": 3}\n\n{"prompt": "or not to be"}\n')
    tokenizer = load_tokenizer(word_tokenizer_path)
    with pytest.raises(ValueError, match="code.jsonl:3: max_tokens"):
        jsonl_requests(path, tokenizer, 2, default_max_tokens=None, seed=0)
    requests = jsonl_requests(path, tokenizer, 2, default_max_tokens=9, seed=0)
    assert sorted(requests, key=lambda r: r.prompt) == [
        SampledRequest("or not to be", 4, 9),
        SampledRequest("to be", 2, 3),
    ]
    path.write_text('{"prompt": 7}\n')
    with pytest.raises(ValueError, match="code.jsonl:1"):
        jsonl_requests(path, tokenizer, 1, default_max_tokens=9, seed=0)


@pytest.mark.parametrize("name", ["random", "text", "prefix_repetition", "sharegpt", "jsonl"])
def test_seeded_runs_pick_the_same_prompts(name: str, tmp_path: Path, word_tokenizer_path: Path) -> None:
    """Every dataset of requests: the same seed picks the same requests in the same order; another seed,
    others (multi_turn: test_conversations)."""
    reply = ("gpt", "that is the question")
    files = {
        "text": HAMLET,
        "prefix_repetition": SONNETS,
        "sharegpt": json.dumps([conversation(("human", f"to be or not {w}"), reply) for w in WORDS]),
        "jsonl": "".join(
            json.dumps({"prompt": f"question {i}", "max_tokens": i + 1}) + "\n" for i in range(20)
        ),
    }
    path = None
    if name in files:
        path = tmp_path / f"data.{name}"
        path.write_text(files[name])
    tokenizer = load_tokenizer(None if name in ("text", "prefix_repetition") else word_tokenizer_path)
    lengths = {"prefix_repetition_prefix_len": 16, "prefix_repetition_suffix_len": 8}

    def pick(seed: int) -> list[SampledRequest]:
        config = DatasetConfig(name, path, 5, seed, prefix_repetition_num_prefixes=2, **lengths)
        return sample_requests(config, tokenizer)

    assert pick(4) == pick(4)
    assert pick(4) != pick(5)


def test_max_tokens_overrides_every_dataset(word_tokenizer_path: Path) -> None:
    """--max-tokens replaces the dataset's own output lengths."""
    tokenizer = load_tokenizer(word_tokenizer_path)
    config = DatasetConfig("random", None, num_prompts=3, seed=0, random_output_len=50, max_tokens=4)
    assert [r.max_tokens for r in sample_requests(config, tokenizer)] == [4, 4, 4]


def test_dataset_config_refuses_missing_path_and_unknown_name() -> None:
    """A file-backed dataset needs --dataset-path; names are the four known ones."""
    with pytest.raises(ValueError, match="needs --dataset-path"):
        DatasetConfig("text", None, num_prompts=1, seed=0)
    with pytest.raises(ValueError, match="unknown dataset"):
        DatasetConfig("sonnet", Path("x"), num_prompts=1, seed=0)


def test_tokenizer_from_a_model_folder_or_a_bad_file(tmp_path: Path, word_tokenizer_path: Path) -> None:
    """--tokenizer takes a tokenizer.json or the folder holding one; anything else is a clear error."""
    assert load_tokenizer(word_tokenizer_path.parent).get_vocab_size() == len(WORDS)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path / "bad.json")
