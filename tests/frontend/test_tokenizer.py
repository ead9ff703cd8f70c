"""Tokenizer built from hello bytes, and the incremental detokenizer's streaming guarantees."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openinfer.engine_core.testing.qwen3_tokenizer import write_qwen3_tokenizer
from openinfer.frontend.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.frontend import tiny_tokenizer

MULTIBYTE = "naïve café 日本語 🙂🚀 brûlée"


def make_tokenizer(config: dict[str, object] | None = None) -> Tokenizer:
    raw_config = json.dumps(config).encode() if config is not None else tiny_tokenizer.tokenizer_config_json()
    return Tokenizer(tiny_tokenizer.tokenizer_json(), raw_config)


def stream(
    tokenizer: Tokenizer, ids: list[int], prompt: list[int], skip_special_tokens: bool = True
) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens)
    return [detokenizer.add([token_id]) for token_id in ids] + [detokenizer.finish()]


def test_encode_decode_round_trip() -> None:
    """Text survives encode then decode, including characters of 2, 3 and 4 bytes."""
    tokenizer = make_tokenizer()
    assert tokenizer.decode(tokenizer.encode(MULTIBYTE)) == MULTIBYTE


def test_config_fields_are_read() -> None:
    """tokenizer_config.json gives the EOS id, the chat template and add_bos_token (which prepends BOS)."""
    tokenizer = make_tokenizer({"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<|im_end|>",
                                "add_bos_token": True, "chat_template": "T"})  # fmt: skip
    assert tokenizer.eos_token_id == tiny_tokenizer.EOS_TOKEN_ID
    assert tokenizer.chat_template == "T"
    assert tokenizer.encode("hello")[0] == tiny_tokenizer.IM_END_TOKEN_ID
    assert tokenizer.special_token_ids == {tiny_tokenizer.EOS_TOKEN_ID, tiny_tokenizer.IM_END_TOKEN_ID}


def test_multibyte_characters_split_across_tokens_never_stream_replacement_chars() -> None:
    """One token at a time, deltas hold no U+FFFD and concatenate to the full decode."""
    tokenizer = make_tokenizer()
    ids = tokenizer.encode(MULTIBYTE)
    assert any(
        "\ufffd" in tokenizer.decode([i]) for i in ids
    )  # the test is only useful if tokens split chars
    deltas = stream(tokenizer, ids, prompt=tokenizer.encode("hello"))
    assert all("\ufffd" not in delta for delta in deltas)
    assert "".join(deltas) == MULTIBYTE


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=30), prompt=st.text(max_size=10))
def test_deltas_concatenate_to_decode(text: str, prompt: str) -> None:
    """For any text and prompt, streamed deltas concatenate to decode(output ids) and carry no U+FFFD."""
    tokenizer = make_tokenizer()
    ids = tokenizer.encode(text)
    deltas = stream(tokenizer, ids, prompt=tokenizer.encode(prompt))
    assert "".join(deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in delta for delta in deltas) or "\ufffd" in text


def test_skip_special_tokens_is_honoured() -> None:
    """A special token in the output is left out by default and kept with skip_special_tokens=False."""
    tokenizer = make_tokenizer()
    ids = [*tokenizer.encode("hello"), tiny_tokenizer.IM_END_TOKEN_ID, *tokenizer.encode(" world")]
    assert "".join(stream(tokenizer, ids, prompt=[])) == "hello world"
    assert "".join(stream(tokenizer, ids, prompt=[], skip_special_tokens=False)) == "hello<|im_end|> world"


def test_truncated_character_is_flushed_at_finish() -> None:
    """A character cut off by the end of the output is held back, then flushed as U+FFFD by finish()."""
    tokenizer = make_tokenizer()
    ids = tokenizer.encode("🙂")
    assert len(ids) > 1  # bytes of an emoji the tiny vocabulary does not merge whole
    detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=True)
    assert detokenizer.add(ids[:-1]) == ""
    assert "\ufffd" in detokenizer.finish()


@pytest.fixture(scope="module")
def qwen3_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """Qwen3's real vocabulary (151,669 ids) as the hello of a Qwen3 engine carries it."""
    folder = write_qwen3_tokenizer(tmp_path_factory.mktemp("qwen3-tokenizer"))
    return Tokenizer(
        (folder / "tokenizer.json").read_bytes(), (folder / "tokenizer_config.json").read_bytes()
    )


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_ids_past_the_tokenizer_decode_as_empty_text(
    qwen3_tokenizer: Tokenizer, skip_special_tokens: bool
) -> None:
    """Qwen3 has 151,936 embedding rows for 151,669 tokens: a sampled padding row (151669..151935) is ""
    in decode, in the stream (also between the tokens of one character) and in logprobs' token text and
    bytes, as in vLLM; so are negative or huge ids (a broken engine): never an exception."""
    tokenizer = qwen3_tokenizer
    ids = tokenizer.encode("Hello 🦜 world")  # Hello, " " + 2 bytes, 1 byte, 1 byte of the parrot, " world"
    assert len(ids) == 5 and tokenizer.token_bytes(ids[2]) == b"\xa6"
    padded = [ids[0], 151669, ids[1], 151935, *ids[2:4], -1, 2**40, ids[4]]
    assert tokenizer.decode(padded, skip_special_tokens) == "Hello 🦜 world"
    prompt = [151700, *tokenizer.encode("say:")]
    deltas = stream(tokenizer, padded, prompt, skip_special_tokens)
    assert "".join(deltas) == "Hello 🦜 world" and all("\ufffd" not in delta for delta in deltas)
    for token_id in (151669, 151935, -1, 2**40):
        assert (tokenizer.token_text(token_id), tokenizer.token_bytes(token_id)) == ("", b"")
    assert tokenizer.token_text(151668) == "</think>"  # the last real id
