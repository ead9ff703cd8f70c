"""A clone is all a user has: no tracked file points outside the repository, and every command that cuts
prompts from a text or trains finds its default text, the tinyshakespeare shipped as package data."""

from __future__ import annotations

import subprocess
import tomllib
from fnmatch import fnmatch
from importlib.resources import files
from pathlib import Path

import pytest

from openinfer.benchmarks import bench, dflash_reference, sweep
from openinfer.benchmarks.datasets import TEXT_DATASETS
from openinfer.benchmarks.workload_flags import dataset_config
from openinfer.engine_core.builtin_model import builtin_text_path
from openinfer.tools import train_dflash, train_dspark, train_target, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
# Spelt in two parts so that this file does not name them: the developers' folder beside the checkout, and the
# contract's copy there (docs/design.md is its twin in the repository).
OUTSIDE = ("../" + "shared", "DESIGN" + ".md")


def tracked_files() -> list[Path]:
    """Every file git tracks in this checkout."""
    result = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60, check=False)
    if result.returncode != 0:
        pytest.skip(f"not a git checkout ({result.stderr.decode().strip()}): no tracked files to read")
    return [REPO / name for name in result.stdout.decode().split("\0") if name]


def test_no_tracked_file_points_outside_the_repository() -> None:
    """No tracked file (code, docs, model cards, deploy files) names the folder beside the checkout or the
    contract's copy there."""
    files = tracked_files()
    assert REPO / "README.md" in files and REPO / "docs" / "design.md" in files
    hits = [
        f"{path.relative_to(REPO)}: {word}"
        for path in files
        if path.is_file()
        for word in OUTSIDE
        if word.encode() in path.read_bytes()
    ]
    assert hits == []


def test_the_builtin_text_ships_in_the_package() -> None:
    """The text is char-rnn's tinyshakespeare, whole (1,115,394 characters), and pyproject.toml's package data
    takes it into an install."""
    path = builtin_text_path()
    text = path.read_text(encoding="utf-8")
    assert len(text) == 1_115_394 and text.startswith("First Citizen:\nBefore we proceed any further")
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    in_package = path.relative_to(Path(str(files("openinfer.engine_core")))).as_posix()
    assert any(fnmatch(in_package, glob) for glob in package_data["openinfer.engine_core"]), in_package


@pytest.mark.parametrize("name", TEXT_DATASETS)
def test_every_text_dataset_defaults_to_the_builtin_text(name: str) -> None:
    """openinfer-bench and its sweep, given no --dataset-path, cut text, prefix_repetition and multi_turn
    prompts from the built-in text; a path given is used as given."""
    args = bench.parse_args(["--dataset-name", name])
    assert dataset_config(args, name, args.dataset_path).path == builtin_text_path()
    assert dataset_config(args, name, Path("mine.txt")).path == Path("mine.txt")
    swept = sweep.parse_args(["--dataset-name", "random", name])
    assert [(c.name, c.path) for c in swept.datasets] == [("random", None), (name, builtin_text_path())]


def test_every_script_defaults_to_the_builtin_text() -> None:
    """The training tools and the DFlash reference comparison read the built-in text unless given one."""
    text = builtin_text_path()
    assert text.is_file()
    assert train_target.parse_args([]).dataset == text
    assert train_dflash.parse_args([]).dataset == text
    assert train_dspark.parse_args([]).dataset == text
    assert train_tokenizer.parse_args([]).dataset_path == text
    assert dflash_reference.parse_args(["--draft-model", "d"]).dataset_path == text
    assert train_target.parse_args(["mine.txt"]).dataset == Path("mine.txt")
