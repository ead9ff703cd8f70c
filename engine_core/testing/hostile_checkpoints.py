"""Damages done to a copy of a tiny two-shard checkpoint (``make_tiny_checkpoint(..., num_shards=2)``) that the
engine must refuse at start with a message naming the file and the problem (issue 39): damaged safetensors,
files outside the folder, a FIFO, /dev/zero, impossible config values. The loader tests and
``benchmarks/checkpoint_attacks.py`` share them."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIRST_SHARD = "model-00001-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


def truncated(folder: Path) -> None:
    """The first shard cut in half: its tensors' data runs past the file's end."""
    shard = folder / FIRST_SHARD
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def huge_header(folder: Path) -> None:
    """The first shard's header length says 2**62 bytes."""
    shard = folder / FIRST_SHARD
    shard.write_bytes(struct.pack("<Q", 2**62) + shard.read_bytes()[8:])


def header_past_the_end(folder: Path) -> None:
    """The first shard's header length says the whole file's size: 8 + header length > file size."""
    shard = folder / FIRST_SHARD
    data = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", len(data)) + data[8:])


def _index_names(folder: Path, file: str) -> None:
    """The index says that `file` holds the first shard's tensors."""
    index = json.loads((folder / INDEX).read_text())
    index["weight_map"] = {name: file if f == FIRST_SHARD else f for name, f in index["weight_map"].items()}
    (folder / INDEX).write_text(json.dumps(index))


def weight_map_up_and_out(folder: Path) -> None:
    """The index names ../outside.safetensors, a valid copy of the first shard beside the folder."""
    shutil.copy(folder / FIRST_SHARD, folder.parent / "outside.safetensors")
    _index_names(folder, "../outside.safetensors")


def weight_map_etc_passwd(folder: Path) -> None:
    _index_names(folder, "/etc/passwd")


def weight_map_dev_zero(folder: Path) -> None:
    _index_names(folder, "/dev/zero")


def symlink_out(folder: Path) -> None:
    """The first shard is a symlink to a valid copy of itself beside the folder."""
    outside = shutil.copy(folder / FIRST_SHARD, folder.parent / "outside.safetensors")
    (folder / FIRST_SHARD).unlink()
    (folder / FIRST_SHARD).symlink_to(outside)


def symlink_to_dev_zero(folder: Path) -> None:
    (folder / FIRST_SHARD).unlink()
    (folder / FIRST_SHARD).symlink_to("/dev/zero")


def fifo(folder: Path) -> None:
    """The first shard is a FIFO: opening it blocks until a writer comes."""
    (folder / FIRST_SHARD).unlink()
    os.mkfifo(folder / FIRST_SHARD)


def directory(folder: Path) -> None:
    (folder / FIRST_SHARD).unlink()
    (folder / FIRST_SHARD).mkdir()


def index_without_weight_map(folder: Path) -> None:
    (folder / INDEX).write_text('{"metadata": {}}')


def _change_config(folder: Path, change: dict[str, Any]) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))


def vocab_of_2_40(folder: Path) -> None:
    """config.json says 2**40 vocabulary rows (256 TiB of embedding at 64 floats a row)."""
    _change_config(folder, {"vocab_size": 2**40})


def nan_rope_theta(folder: Path) -> None:
    _change_config(folder, {"rope_parameters": {"rope_type": "default", "rope_theta": float("nan")}})


def eos_past_the_vocabulary(folder: Path) -> None:
    _change_config(folder, {"eos_token_id": 10**6})


HOSTILE_CHECKPOINTS: dict[str, Callable[[Path], None]] = {
    damage.__name__: damage
    for damage in (
        truncated,
        huge_header,
        header_past_the_end,
        weight_map_up_and_out,
        weight_map_etc_passwd,
        weight_map_dev_zero,
        symlink_out,
        symlink_to_dev_zero,
        fifo,
        directory,
        index_without_weight_map,
        vocab_of_2_40,
        nan_rope_theta,
        eos_past_the_vocabulary,
    )
}
