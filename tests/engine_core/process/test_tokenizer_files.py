"""The tokenizer config an engine sends: tokenizer_config.json, with chat_template.jinja folded in."""

from __future__ import annotations

import json
from pathlib import Path

from openinfer.engine_core.process.tokenizer_files import read_tokenizer_config


def test_missing_config_is_an_empty_object(tmp_path: Path) -> None:
    """No tokenizer_config.json and no template file: b"{}"."""
    assert read_tokenizer_config(tmp_path) == b"{}"


def test_chat_template_file_is_folded_in(tmp_path: Path) -> None:
    """A chat_template.jinja (how recent transformers save templates) fills a config without one."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<e>"}))
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }} é")
    assert json.loads(read_tokenizer_config(tmp_path)) == {
        "eos_token": "<e>",
        "chat_template": "{{ messages[0]['content'] }} é",
    }


def test_template_in_the_config_wins(tmp_path: Path) -> None:
    """A config that has a chat_template is sent byte for byte."""
    raw = json.dumps({"chat_template": "A"}).encode()
    (tmp_path / "tokenizer_config.json").write_bytes(raw)
    (tmp_path / "chat_template.jinja").write_text("B")
    assert read_tokenizer_config(tmp_path) == raw
