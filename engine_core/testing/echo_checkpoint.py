"""A real-vocabulary Qwen3 checkpoint whose weights are set, not trained, so that greedy decoding repeats a
chat's last user message: the way tests show the serving path model output that holds reasoning blocks and
tool calls, which random weights never write.

The model is one attention head that looks exactly ``distance`` positions back and copies the token there.
Its query and key are the same for every token (each embedding holds a constant first coordinate, the
only one ``q_proj`` and ``k_proj`` read; ``q_norm`` and ``k_norm`` then make them the vectors below), so
the score depends on the offset alone, through RoPE: ``sum_j A^2 cos(theta_j (offset - distance))``, which
peaks at ``distance`` by ``A^2 * 8.4 / 8`` over every other offset (``rope_theta`` 2: the 32 frequencies
lie in [0.51, 1]). ``v_proj`` and ``o_proj`` copy the attended token's embedding into the second half of
the hidden state, which the LM head alone reads: each token's row there is its own embedding (random unit
vectors in 63 dimensions), so the copied token has the top logit. Every MLP's ``down_proj`` is zero.

In Qwen3's chat template a user message of ``n`` tokens is followed by ``<|im_end|>\\n<|im_start|>assistant
\\n`` (5 tokens; 9 with ``enable_thinking: false``'s empty think block), so with ``distance = n + 4``
(``n + 8``) the answer is the message, token for token, ended by its ``<|im_end|>``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from openinfer.engine_core.testing.qwen3_checkpoint import QWEN3_CHAT_TEMPLATE, QWEN3_EOS_TOKEN_IDS
from openinfer.engine_core.testing.qwen3_tokenizer import QWEN3_TOKEN_IDS, write_qwen3_tokenizer
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint

HIDDEN_SIZE = 128  # [constant, token embedding (63), the copied constant, the copied embedding (63)]
HEAD_DIM = 64  # one head; its values are the first half of the hidden state
ROPE_THETA = 2.0
ECHO_QWEN3_CONFIG: Mapping[str, Any] = {
    "vocab_size": 151936,  # Qwen3's rows: 151,669 tokens and padding (78 MB of bfloat16 in all)
    "hidden_size": HIDDEN_SIZE,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": HEAD_DIM,
    "max_position_embeddings": 4096,
    "rope_theta": ROPE_THETA,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": QWEN3_TOKEN_IDS["<|endoftext|>"],
    "eos_token_id": QWEN3_TOKEN_IDS["<|im_end|>"],
    "pad_token_id": None,
}
CHAT_SUFFIX_TOKENS = 5  # <|im_end|> \n <|im_start|> assistant \n, after the last user message
NO_THINKING_SUFFIX_TOKENS = 9  # and <think> \n\n </think> \n\n (enable_thinking: false)
_SCORE_SCALE = 40.0  # A^2: the matched offset's score leads every other one by ~42 (before the softmax)
_LOGIT_SCALE = 8.0  # the copied token's logit is ~45; any other's at most ~0.6 of that


def make_echo_qwen3_checkpoint(folder: Path | str, distance: int, *, seed: int = 0) -> Path:
    """Write the checkpoint into ``folder``: greedy decoding at position p writes the token at
    ``p - distance`` (see the module docstring); Qwen3's tokenizer files, generation_config.json (EOS
    151645 and 151643) and chat template come with it."""
    from safetensors.torch import load_file, save_file

    if not 0 < distance < ECHO_QWEN3_CONFIG["max_position_embeddings"]:
        raise ValueError(
            f"distance must be in [1, {ECHO_QWEN3_CONFIG['max_position_embeddings']}), got {distance}"
        )
    folder = Path(folder)
    make_tiny_checkpoint(folder, seed=seed, overrides=ECHO_QWEN3_CONFIG, dtype=torch.bfloat16)
    weights = {
        name: torch.zeros_like(tensor) for name, tensor in load_file(folder / "model.safetensors").items()
    }
    vocab_size = weights["model.embed_tokens.weight"].shape[0]
    half = HIDDEN_SIZE // 2
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.nn.functional.normalize(torch.randn(vocab_size, half - 1, generator=generator), dim=1)
    embed = torch.zeros(vocab_size, HIDDEN_SIZE)
    embed[:, 0] = 1.0  # the constant the query and key are made of
    embed[:, 1:half] = tokens
    head = torch.zeros(vocab_size, HIDDEN_SIZE)
    head[:, half + 1 :] = _LOGIT_SCALE * tokens  # reads the copied embedding only
    query, key = _offset_query_key(distance)
    prefix = "model.layers.0."
    weights["model.embed_tokens.weight"] = embed
    weights["lm_head.weight"] = head
    weights[prefix + "self_attn.q_proj.weight"][:, 0] = 1.0  # every query is ones before q_norm
    weights[prefix + "self_attn.k_proj.weight"][:, 0] = 1.0
    weights[prefix + "self_attn.q_norm.weight"] = query
    weights[prefix + "self_attn.k_norm.weight"] = key
    weights[prefix + "self_attn.v_proj.weight"] = torch.eye(HEAD_DIM, HIDDEN_SIZE)  # the first half
    # The input norm scales the first half (norm sqrt(2) of 128 dimensions) by 8: scale it back.
    weights[prefix + "self_attn.o_proj.weight"] = torch.eye(HIDDEN_SIZE, HEAD_DIM).roll(half, dims=0) / 8
    for name in (
        "model.norm.weight",
        prefix + "input_layernorm.weight",
        prefix + "post_attention_layernorm.weight",
    ):
        weights[name] = torch.ones(HIDDEN_SIZE)
    save_file(
        {n: t.to(torch.bfloat16) for n, t in weights.items()},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    generation = {
        "bos_token_id": ECHO_QWEN3_CONFIG["bos_token_id"],
        "eos_token_id": list(QWEN3_EOS_TOKEN_IDS),
    }
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    write_qwen3_tokenizer(folder)
    (folder / "chat_template.jinja").write_text(QWEN3_CHAT_TEMPLATE, encoding="utf-8")
    return folder


def _offset_query_key(distance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q_norm and k_norm weights whose RoPE'd product is ``A^2 cos(theta_j (offset - distance))`` in each
    frequency pair j: the query is A in each pair's first coordinate; the key is A rotated ahead by
    ``theta_j * distance`` (RoPE turns pair (x1, x2) as the complex x1 + i x2, by position * theta_j)."""
    amplitude = math.sqrt(_SCORE_SCALE)
    theta = 1.0 / ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)  # (32,)
    query = torch.cat((torch.full((HEAD_DIM // 2,), amplitude), torch.zeros(HEAD_DIM // 2)))
    angle = theta * distance
    key = amplitude * torch.cat((angle.cos(), angle.sin()))
    return query.float(), key.float()
