"""A random checkpoint in Qwen3-0.6B's real layout: its widths, bf16 weights in 2 shards with an index, the
real Qwen vocabulary, generation_config.json's two EOS ids and the chat template in chat_template.jinja."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from openinfer.engine_core.testing.qwen3_tokenizer import QWEN3_TOKEN_IDS, write_qwen3_tokenizer
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint

# Qwen3-0.6B's config.json (transformers' Qwen3Config arguments), but 28 layers and 40960 positions.
QWEN3_0_6B_CONFIG: MappingProxyType[str, Any] = MappingProxyType(
    {
        "vocab_size": 151936,  # embedding rows; the tokenizer has 151669 tokens, the rest is padding
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,  # explicit: 16 * 128 = 2048 != hidden_size
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": QWEN3_TOKEN_IDS["<|endoftext|>"],
        "eos_token_id": QWEN3_TOKEN_IDS["<|im_end|>"],
        "pad_token_id": None,
    }
)
# generation_config.json stops on both: <|im_end|> ends a chat turn, <|endoftext|> a document.
QWEN3_EOS_TOKEN_IDS = (QWEN3_TOKEN_IDS["<|im_end|>"], QWEN3_TOKEN_IDS["<|endoftext|>"])  # (151645, 151643)

# Qwen3's ChatML template as its chat_template.jinja has it, written from Qwen3's documented format: the
# tools as JSON lines in a <tools> block of the system turn, an assistant's tool_calls as
# <tool_call>{"name", "arguments"}</tool_call> blocks, tool results as <tool_response> blocks of a user
# turn, thinking kept only on assistant turns after the last user query, reasoning_content, and
# `enable_thinking: false` answering with an empty think block.
QWEN3_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""  # noqa: E501 - the template's own long lines


# Qwen3-0.6B's layout and vocabulary at small widths (4 query heads over 2 KV heads): a real-vocabulary model
# tensor-parallel tests shard over two ranks, one KV head a rank
SMALL_REAL_VOCAB_WIDTHS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def make_qwen3_0_6b_shaped_checkpoint(
    folder: Path | str,
    *,
    num_hidden_layers: int = 2,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    init_std: float = 0.2,
    dtype: torch.dtype = torch.bfloat16,
    num_shards: int = 2,
    widths: Mapping[str, Any] | None = None,
) -> Path:
    """Write a Qwen3-0.6B-shaped checkpoint with random weights (make_tiny_checkpoint's draw) into
    ``folder``: config.json, the weights in ``dtype`` split into ``num_shards`` safetensors files with
    ``model.safetensors.index.json``, generation_config.json (EOS 151645 and 151643), Qwen3's tokenizer
    files and chat_template.jinja (tokenizer_config.json holds no template, as transformers 5 saves it).
    Two layers take ~190M parameters (the tied embedding is 155M of them): ~10 s and 380 MB in bf16.
    ``widths`` overrides config fields (``{"hidden_size": 64, ...}``: a small model of the real vocabulary)."""
    folder = Path(folder)
    overrides = {
        **QWEN3_0_6B_CONFIG,
        "num_hidden_layers": num_hidden_layers,
        "max_position_embeddings": max_position_embeddings,
        **(widths or {}),
    }
    make_tiny_checkpoint(
        folder, seed=seed, init_std=init_std, overrides=overrides, dtype=dtype, num_shards=num_shards
    )
    generation = {
        "bos_token_id": QWEN3_TOKEN_IDS["<|endoftext|>"],
        "do_sample": True,
        "eos_token_id": list(QWEN3_EOS_TOKEN_IDS),
        "pad_token_id": QWEN3_TOKEN_IDS["<|endoftext|>"],
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    }
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    write_qwen3_tokenizer(folder)  # replaces the built-in tokenizer files make_tiny_checkpoint copied
    (folder / "chat_template.jinja").write_text(QWEN3_CHAT_TEMPLATE, encoding="utf-8")
    return folder
