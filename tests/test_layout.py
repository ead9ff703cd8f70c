"""docs/design.md's layout table, row by row: every module of a package imports, in a fresh interpreter, none of
the modules its row forbids (the launcher included: it reads the frontend's flags from frontend/process/flags.py); and
no test file imports another."""

from __future__ import annotations

import ast
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
    *(
        Row(f"openinfer.frontend.{sub}", FRONTEND, recursive=True)
        for sub in ("openai", "engines", "metrics", "process")
    ),
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
    assert {"aiohttp", "prometheus_client"} <= loaded_after_importing(["openinfer.frontend.process.main"])


def test_the_flag_readers_import_no_torch() -> None:
    """openinfer-serve and openinfer-engine read their flags, and a drafter folder's block size, without
    torch: the launcher imports no torch, and a bad flag is refused before torch loads."""
    flags = ["openinfer.engine_core.process.engine_args", "openinfer.engine_core.launch.serve_args",
             "openinfer.engine_core.spec_decode.drafter_loaders"]  # fmt: skip
    assert "torch" not in loaded_after_importing(flags)


def imported_test_modules(tree: ast.Module, root: Path) -> list[str]:
    """The ``test_*`` modules of the tests package that a parsed file imports: ``from tests.x.test_y import``,
    ``import tests.x.test_y``, and ``from tests.x import test_y`` where ``root``/tests/x/test_y.py is a file
    (not a name a harness module defines)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            folder = root.joinpath(*node.module.split("."))
            names = [node.module]
            names += [f"{node.module}.{a.name}" for a in node.names if (folder / f"{a.name}.py").is_file()]
        else:
            continue
        found += [n for n in names if n.split(".")[0] == "tests" and n.split(".")[-1].startswith("test_")]
    return found


def test_no_test_file_imports_another() -> None:
    """No tests/**/test_*.py imports another test_*.py module: what tests share lives in plain harness modules
    beside them or in engine_core/testing/ (docs/design.md's layout table)."""
    root = Path(__file__).parent.parent
    offenders = {
        str(path.relative_to(root)): imported
        for path in sorted((root / "tests").rglob("test_*.py"))
        if (imported := imported_test_modules(ast.parse(path.read_text(), str(path)), root))
    }
    assert offenders == {}


def test_the_import_check_sees_each_form() -> None:
    """The three ways of importing a test module are found; a harness module, a name imported from one, and a
    module outside tests are not."""
    source = (
        "from tests.engine_core.spec_decode.test_dflash import draft_checkpoint\n"
        "import tests.engine_core.spec_decode.test_dspark\n"
        "from tests.engine_core.spec_decode import test_ngram, plain_dflash\n"
        "from tests.engine_core.spec_decode.plain_dflash import test_looking_name\n"
        "import test_elsewhere\n"
    )
    assert imported_test_modules(ast.parse(source), Path(__file__).parent.parent) == [
        "tests.engine_core.spec_decode.test_dflash",
        "tests.engine_core.spec_decode.test_dspark",
        "tests.engine_core.spec_decode.test_ngram",
    ]
