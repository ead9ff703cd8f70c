"""The tokenizer files an engine sends in its hello, read from the model folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

from openinfer.engine_core.models.model_folder import model_file

_OPTIONAL = ("tokenizer_config.json", "chat_template.jinja")


def check_tokenizer_files(folder: Path) -> None:
    """ValueError unless the folder's tokenizer.json, and its tokenizer_config.json and chat_template.jinja
    where present, are regular files in it (`model_file`): the hello reads them, and a FIFO would hang it."""
    model_file(folder, "tokenizer.json")
    for name in _OPTIONAL:
        if os.path.lexists(folder / name):
            model_file(folder, name)


def read_tokenizer_config(folder: Path) -> bytes:
    """``tokenizer_config.json`` (``b"{}"`` when absent), with the chat template folded in from
    ``chat_template.jinja`` when the config has none: recent transformers save the template there."""
    config_path, template_path = folder / "tokenizer_config.json", folder / "chat_template.jinja"
    raw = config_path.read_bytes() if config_path.exists() else b"{}"
    if not template_path.exists():
        return raw
    try:
        config = json.loads(raw)
    except ValueError:
        return raw  # the frontend refuses it with a clear message
    if not isinstance(config, dict) or config.get("chat_template"):
        return raw
    config["chat_template"] = template_path.read_text(encoding="utf-8")
    return json.dumps(config, ensure_ascii=False).encode("utf-8")
