"""The echo checkpoint: transformers' greedy decoding on it repeats a chat's last user message of the length
its distance says, with and without thinking, then stops at <|im_end|> (docs/design.md invariant 1 makes the
engine's greedy the same)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from openinfer.engine_core.testing.echo_checkpoint import (
    CHAT_SUFFIX_TOKENS,
    NO_THINKING_SUFFIX_TOKENS,
    make_echo_qwen3_checkpoint,
)

DISTANCE = 40
CALL = '<tool_call>\n{"name": "f", "arguments": {"x": [1, 2, 3, 4]}}\n</tool_call>'
MESSAGES = {  # each exactly as long as the model repeats (a test below checks it)
    CHAT_SUFFIX_TOKENS: "<think>\nhm, hm\n</think>\n\n" + CALL,
    NO_THINKING_SUFFIX_TOKENS: "Calling it now.\n" + CALL,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_echo_qwen3_checkpoint(tmp_path_factory.mktemp("echo") / "echo", DISTANCE)


@pytest.mark.parametrize("suffix", [CHAT_SUFFIX_TOKENS, NO_THINKING_SUFFIX_TOKENS])
def test_greedy_repeats_the_message(folder: Path, suffix: int) -> None:
    """A message of DISTANCE + 1 - suffix tokens comes back token for token, then <|im_end|>."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = MESSAGES[suffix]
    assert len(tokenizer.encode(text, add_special_tokens=False)) == DISTANCE + 1 - suffix
    kwargs = {} if suffix == CHAT_SUFFIX_TOKENS else {"enable_thinking": False}
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )
    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        output = model.generate(torch.tensor([prompt]), max_new_tokens=DISTANCE, do_sample=False)
    generated = output[0, len(prompt) :].tolist()
    assert generated[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(generated[:-1]) == text


def test_distance_must_fit_the_positions(tmp_path: Path) -> None:
    """A distance the model's positions cannot hold is refused before anything is written."""
    with pytest.raises(ValueError, match="distance"):
        make_echo_qwen3_checkpoint(tmp_path / "x", 4096)
    assert not (tmp_path / "x").exists()
