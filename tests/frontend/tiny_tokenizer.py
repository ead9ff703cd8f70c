"""A tiny byte-level BPE tokenizer trained in the test, standing in for a model's tokenizer files."""

from __future__ import annotations

import functools
import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from openinfer.frontend.tokenizer import Tokenizer as OpenInferTokenizer

EOS_TOKEN_ID = 0  # "<|endoftext|>", the first special token
IM_END_TOKEN_ID = 1  # "<|im_end|>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_end|>"]

_CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog",
    "speculative decoding drafts tokens and the target verifies them",
    "naïve café crème brûlée, 日本語のテキスト, emoji 🙂🚀 and ÅÄÖ",
]


@functools.cache
def tokenizer_json() -> bytes:
    """tokenizer.json of a 300-token byte-level BPE: every byte is a token, so any text encodes."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return tokenizer.to_str().encode()


# One line per message, then the assistant's turn: easy to predict in tests.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def tokenizer_config_json() -> bytes:
    return json.dumps({"eos_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE}).encode()


def make_tokenizer() -> OpenInferTokenizer:
    """The frontend's Tokenizer over these files, to compute expected texts."""
    return OpenInferTokenizer(tokenizer_json(), tokenizer_config_json())
