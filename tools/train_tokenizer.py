"""Train the built-in tiny model's tokenizer (run once by the project; the outputs are committed).

Byte-level BPE on tinyshakespeare (the copy in `engine_core/builtin/data/` unless --dataset-path), 512 tokens
in all:
  ids 0..2    special tokens <|endoftext|> (EOS and pad), <|im_start|>, <|im_end|>
  ids 3..258  the 256 byte symbols, so any text encodes
  ids 259..   253 merges learned from the dataset

Writes `engine_core/builtin/tokenizer.json` and `engine_core/builtin/tokenizer_config.json`, a Hugging
Face-style folder that `transformers.AutoTokenizer.from_pretrained` loads. The output is deterministic: the
same dataset gives byte-identical files.

    python tools/train_tokenizer.py [--dataset-path PATH] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from openinfer.engine_core.builtin_model import builtin_text_path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT_DIR = REPO_ROOT / "engine_core" / "builtin"

VOCAB_SIZE = 512  # total, special tokens included
# Order fixes the ids: the trainer puts special tokens first, 0..2.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 2048

# Qwen-style ChatML: one `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then the assistant header.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def build_tokenizer(text: str) -> Tokenizer:
    """Train the byte-level BPE tokenizer on `text`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # Offsets only (ids are unaffected): a token's span keeps its leading space, as in Qwen's tokenizer.json.
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 byte symbols, seen or not
        show_progress=False,
    )
    # Lines keep their "\n" so newline runs are learned as tokens too.
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer, length=None)
    return tokenizer


def tokenizer_config(tokenizer: Tokenizer) -> dict[str, object]:
    """The Hugging Face `tokenizer_config.json` matching `tokenizer`."""
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    added_tokens_decoder = {
        str(tokenizer.token_to_id(token)): {"content": token, **flags} for token in SPECIAL_TOKENS
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "bos_token": None,
        "add_bos_token": False,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,  # decode must give back the exact text
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def check(tokenizer: Tokenizer) -> None:
    """Refuse to write a tokenizer that breaks what the engine relies on."""
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab_size != VOCAB_SIZE:
        raise SystemExit(
            f"trained vocabulary has {vocab_size} tokens, expected {VOCAB_SIZE}: use a larger dataset"
        )
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != expected_id:
            raise SystemExit(f"{token} got id {tokenizer.token_to_id(token)}, expected {expected_id}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dataset-path",
        type=Path,
        default=builtin_text_path(),
        help="training text, UTF-8 (default: the built-in tinyshakespeare, engine_core/builtin/data/)",
    )
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where to write the two files")
    return parser.parse_args(argv)


def main() -> None:
    """Train the tokenizer and write the two files."""
    args = parse_args()

    text = args.dataset_path.read_text(encoding="utf-8")
    tokenizer = build_tokenizer(text)
    check(tokenizer)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out_dir / "tokenizer.json"), pretty=True)
    config_path = args.out_dir / "tokenizer_config.json"
    config_path.write_text(json.dumps(tokenizer_config(tokenizer), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out_dir / 'tokenizer.json'} and {config_path} ({VOCAB_SIZE} tokens)")


if __name__ == "__main__":
    main()
