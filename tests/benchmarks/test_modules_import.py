"""Every benchmark and tool module imports: a name it takes from the engine or the frontend still exists (the
type check does not follow ``openinfer.*`` imports across the package-dir mapping, so this is the guard)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from openinfer import benchmarks, tools

MODULES = [
    f"{package.__name__}.{info.name}"
    for package in (benchmarks, tools)
    for info in pkgutil.iter_modules(package.__path__)
]


@pytest.mark.parametrize("module", MODULES)
def test_module_imports(module: str) -> None:
    """The module imports without error."""
    importlib.import_module(module)
