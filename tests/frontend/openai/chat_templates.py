"""The chat templates and conversations the template tests render (in-process and in worker processes)."""

from __future__ import annotations

# A Qwen3-style template written for the tests: a namespace scan for the last user turn, thinking stripped
# from earlier assistant turns, a system check with raise_exception, tojson on extra fields, whitespace
# control under trim_blocks / lstrip_blocks, and the enable_thinking switch of chat_template_kwargs.
QWEN_STYLE = """
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}
    {%- if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}{{ raise_exception('the system message must come first') }}{% endif %}
        {{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in message.content %}
        {%- set answer = message.content.split('</think>')[-1].lstrip('\\n') %}
        {{- '<|im_start|>assistant\\n' + answer + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content }}
        {%- if message.meta is defined %} {{ message.meta | tojson }}{% endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{% endif %}
{%- endif %}
{{- eos_token if messages | length > 3 else '' }}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "ROMEO: hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What light?"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nThe east."},
        {"role": "user", "content": "naïve café 🙂", "meta": {"lang": "fr", "score": 0.5}},
    ],
]
