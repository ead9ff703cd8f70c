"""Broken or hostile checkpoint folders fail at load with a ValueError naming the file and the problem (the
engine exits 2 on it, which serve does not restart): damaged safetensors, files outside the folder, FIFOs and
devices, a config.json whose sizes the weights cannot fill. Nothing hangs, nothing huge is allocated."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from openinfer.engine_core.models.weights import checkpoint_files
from openinfer.engine_core.process.tokenizer_files import check_tokenizer_files
from openinfer.engine_core.testing.engine_cores import generate_greedy, make_core
from openinfer.engine_core.testing.hostile_checkpoints import FIRST_SHARD as SHARD
from openinfer.engine_core.testing.hostile_checkpoints import HOSTILE_CHECKPOINTS
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint
from openinfer.engine_core.worker.model_runner import ModelRunner


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 checkpoint in 2 shards with model.safetensors.index.json (copied by each test)."""
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("base") / "model", overrides=SMALL_QWEN3, num_shards=2
    )


def load(folder: Path) -> ModelRunner:
    return ModelRunner(folder, torch.device("cpu"), num_kv_blocks=1, block_size=16)


def copy_of(base: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base, tmp_path / "model", symlinks=True))


@contextmanager
def fifo_unblocked_after(fifo: Path, seconds: float) -> Iterator[None]:
    """A bound on a blocked open of `fifo`: after `seconds` a writer process opens and closes it, so that an
    open that blocked returns (its read sees EOF) and the test fails on the message instead of hanging. A
    process, not a thread: safetensors blocks in open() holding the GIL."""
    writer = subprocess.Popen(["sh", "-c", f'sleep {seconds}; : > "$0"', str(fifo)])
    try:
        yield
    finally:
        writer.kill()  # by pid; it is still sleeping, or blocked until a reader that never comes
        writer.wait()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated", f"{SHARD} is not a valid safetensors file .*file not fully covered"),
        ("huge_header", f"{SHARD} is not a valid safetensors file .*header too large"),
        ("header_past_the_end", f"{SHARD} is not a valid safetensors file .*invalid header length"),
        ("weight_map_up_and_out", "'../outside.safetensors' is outside the model folder"),
        ("weight_map_etc_passwd", "'/etc/passwd' is outside the model folder"),
        ("weight_map_dev_zero", "'/dev/zero' is outside the model folder"),
        ("symlink_out", f"{SHARD} leads to .*outside.safetensors, outside the model folder"),
        ("symlink_to_dev_zero", f"{SHARD} leads to /dev/zero, outside the model folder"),
        ("directory", f"{SHARD} is a directory, not a regular file"),
        ("index_without_weight_map", "model.safetensors.index.json is not a safetensors index"),
        # refused from the headers' sizes before anything is allocated, not by the allocator
        ("vocab_of_2_40", "config.json does not describe these weights"),
        ("nan_rope_theta", "rope_theta must be a finite number > 0, got nan"),
        ("eos_past_the_vocabulary", r"eos_token_id \[1000000\] outside the vocabulary \(0..255\)"),
    ],
)
def test_hostile_checkpoints_are_refused(sharded: Path, tmp_path: Path, damage: str, message: str) -> None:
    """Each damage is a ValueError naming the file and what is wrong (safetensors' own errors included)."""
    folder = copy_of(sharded, tmp_path)
    HOSTILE_CHECKPOINTS[damage](folder)
    with pytest.raises(ValueError, match=message):
        load(folder)


@pytest.mark.parametrize("name", ["model.safetensors", SHARD], ids=["single", "shard"])
def test_a_fifo_is_refused_without_being_opened(sharded: Path, tmp_path: Path, name: str) -> None:
    """A FIFO in the place of model.safetensors or of a shard is refused by its type: an open would block
    until a writer came (the bound below unblocks one, then the message differs)."""
    folder = copy_of(sharded, tmp_path)
    if name == "model.safetensors":
        for file in folder.glob("model*.safetensors*"):
            file.unlink()
    else:
        (folder / name).unlink()
    os.mkfifo(folder / name)
    with fifo_unblocked_after(folder / name, 30.0), pytest.raises(ValueError, match="is a FIFO"):
        load(folder)


def test_a_hugging_face_cache_snapshot_loads(sharded: Path, tmp_path: Path) -> None:
    """The Hugging Face cache's layout stays readable: snapshots/REV/* are symlinks to ../../blobs/HASH."""
    repo = tmp_path / "models--tiny"
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in sharded.iterdir():
        blob = Path(shutil.copy(file, repo / "blobs" / f"hash-{file.name}"))
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    assert [path.name for path in checkpoint_files(snapshot)] == [SHARD, "model-00002-of-00002.safetensors"]
    load(snapshot)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"])
def test_tokenizer_files_that_are_fifos_are_refused(tmp_path: Path, name: str) -> None:
    """The engine's hello reads the tokenizer files: a FIFO among them is refused at start, not read."""
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / file).write_text("{}")
    check_tokenizer_files(tmp_path)
    (tmp_path / name).unlink(missing_ok=True)
    os.mkfifo(tmp_path / name)
    with fifo_unblocked_after(tmp_path / name, 30.0), pytest.raises(ValueError, match="is a FIFO"):
        check_tokenizer_files(tmp_path)


def test_a_huge_max_position_embeddings_sizes_nothing_past_the_kv_cache(tmp_path: Path) -> None:
    """A config.json's max_position_embeddings of 2^31 - 1 (its RoPE table asked 16 GiB at the first step, the
    engine's token rows 1 TiB at start): rows, RoPE table and padded steps cover only the positions the KV
    cache can hold, and the engine serves the tokens it serves at the checkpoint's own 2048."""
    tokens = []
    for positions in (2048, 2**31 - 1):
        folder = make_tiny_checkpoint(tmp_path / str(positions), seed=3,
                                      overrides={**SMALL_QWEN3, "max_position_embeddings": positions})  # fmt: skip
        core = make_core(folder, num_kv_blocks=64)  # 64 blocks of 16: 1,024 positions reachable
        assert core.worker.input_batch.token_ids.shape[1] == 1024
        tokens.append(generate_greedy(core, [[5, 6, 7, 8]], max_tokens=6))
    assert tokens[0] == tokens[1] and len(tokens[0][0]) == 6
