"""docs/design.md's layout table, row by row: every module of a package imports, in a fresh interpreter, none of
the modules its row forbids (the launcher included: it reads the frontend's flags from frontend/flags.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Row:
    """One package (or subpackage) of a row of the layout table and what its modules must not import."""

    package: str
    forbidden: tuple[str, ...]
    recursive: bool = False  # its subpackages too (else only the package's own modules)
    also: tuple[str, ...] = ()  # modules outside it held to the same rule


ENGINE_CORE = ("aiohttp", "prometheus_client")
# The frontend image installs neither torch nor transformers; openinfer-verify-log ships in it.
FRONTEND = ("torch", "transformers")
ROWS = [
    Row("openinfer.protocol", ("torch", "aiohttp", "zmq"), recursive=True),
    Row("openinfer.engine_core", ENGINE_CORE),
    *(
        Row(f"openinfer.engine_core.{sub}", ENGINE_CORE, recursive=True)
        for sub in ("core", "worker", "sample", "models", "spec_decode", "process", "launch", "testing")
    ),
    Row("openinfer.kernels", ("aiohttp", "zmq"), recursive=True),
    Row("openinfer.frontend", FRONTEND, also=("openinfer.tools.verify_log",)),
    *(Row(f"openinfer.frontend.{sub}", FRONTEND, recursive=True) for sub in ("openai", "engines", "metrics")),
]

# Imports the modules given as arguments, then prints the top-level names of those loaded.
PROBE = (
    "import importlib, json, sys\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
)


def modules_of(row: Row) -> list[str]:
    """The package and every module in its folder (and in its subfolders when ``recursive``), by file."""
    spec = importlib.util.find_spec(row.package)
    assert spec is not None and spec.submodule_search_locations, row.package
    folder = Path(next(iter(spec.submodule_search_locations)))
    pattern = "**/*.py" if row.recursive else "*.py"
    names = [row.package]
    for path in sorted(folder.glob(pattern)):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.append(".".join((row.package, *parts)))
    return names + list(row.also)


def loaded_after_importing(modules: list[str]) -> set[str]:
    """Top-level names in ``sys.modules`` of a fresh interpreter that imported ``modules``."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return set(json.loads(result.stdout))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.package.removeprefix("openinfer."))
def test_a_package_imports_nothing_its_row_forbids(row: Row) -> None:
    """Every module of the package, imported in a fresh interpreter, leaves its row's forbidden modules out of
    sys.modules."""
    modules = modules_of(row)
    assert len(modules) > 1, modules  # the package and at least one module of it
    assert loaded_after_importing(modules) & set(row.forbidden) == set(), (row.package, modules)


def test_the_probe_sees_a_forbidden_import() -> None:
    """The same probe finds aiohttp and prometheus_client once a module that loads them is imported (the
    frontend's main), so an empty answer above means the imports were absent."""
    assert {"aiohttp", "prometheus_client"} <= loaded_after_importing(["openinfer.frontend.main"])
