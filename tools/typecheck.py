"""Type-check every package as ``openinfer.*``, so mypy follows each import into the package it names.

    python -m openinfer.tools.typecheck [mypy's own flags ...]

The top-level folders install under ``openinfer.`` through ``pyproject.toml``'s ``package-dir``, a mapping mypy
cannot read: given the folders, it checks each alone and treats every ``openinfer.*`` import as missing. Here
``build/typecheck/openinfer/<name>`` links to each folder the mapping names, mypy searches that tree, and so
sees one package, as the installed project is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def top_packages() -> dict[str, str]:
    """``openinfer.<name>`` → folder, for the mapping's top-level entries (subpackages follow their folders)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: folder for name, folder in mapping.items() if name.count(".") == 1}


def link_tree() -> list[str]:
    """Link ``build/typecheck/openinfer/<name>`` to each top-level folder; return the package names."""
    names = []
    for name, folder in top_packages().items():
        link = TREE / name.replace(".", "/")
        link.parent.mkdir(parents=True, exist_ok=True)
        target = Path("../../..") / folder  # relative: the tree moves with the checkout
        if not (link.is_symlink() and link.readlink() == target):
            link.unlink(missing_ok=True)
            link.symlink_to(target, target_is_directory=True)
        names.append(name)
    return names


def main() -> None:
    packages = [arg for name in link_tree() for arg in ("-p", name)]
    command = [sys.executable, "-m", "mypy", *packages, *sys.argv[1:]]
    result = subprocess.run(command, cwd=ROOT, env={**os.environ, "MYPYPATH": str(TREE)})
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
