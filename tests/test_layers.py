"""docs/architecture.md's layers, held: no module circle anywhere, and every ``openinfer.*`` import (read with ast,
imports inside functions and ``TYPE_CHECKING`` blocks included) goes down the order of packages and of rooms.

A room is a package's subfolder; the modules at a package's top are its base room, the lowest: what every room
shares (configs, the request, the decision), importing none of them. A room imports itself and what stands
below it; a package imports itself and the packages below it.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Top to bottom: each imports only what is below it (runtime packages never import tools/ or benchmarks/).
PACKAGES = ["benchmarks", "tools", "engine_core", "frontend", "kernels", "protocol"]
ROOMS = {
    # testing/ is imported by tests, benchmarks and tools only: nothing of the engine's own imports it
    "engine_core": ["testing", "launch", "process", "core", "spec_decode", "worker", "sample", "models", ""],
    "frontend": ["process", "openai", "engines", "metrics", ""],
}


def modules() -> dict[str, Path]:
    """Every module of the project, by its import name, from pyproject.toml's package-dir mapping."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in mapping.items():
        for path in (ROOT / folder).glob("*.py"):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The project modules ``name`` imports, anywhere in its file."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        yield from (target for target in targets if target in known and target != name)


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports_of(name, path, known)) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def place(module: str) -> tuple[str, str]:
    """(package, room) of ``openinfer.<package>[.<room>].<module>``; room "" is the package's base."""
    parts = module.split(".")
    package = parts[1]
    rooms = ROOMS.get(package, [""])
    room = parts[2] if len(parts) > 3 and parts[2] in rooms else ""
    return package, room


def test_no_module_circles() -> None:
    """No two modules import each other, directly or round a ring."""
    assert circles(import_graph()) == []


def test_imports_go_down() -> None:
    """Every import goes to the same room or a lower one, and to the same package or a lower one."""
    upward = defaultdict(list)
    for module, targets in import_graph().items():
        package, room = place(module)
        for target in targets:
            target_package, target_room = place(target)
            if PACKAGES.index(target_package) < PACKAGES.index(package):
                upward[f"{package} -> {target_package}"].append(f"{module} -> {target}")
            elif target_package == package and target_room != room:
                rooms = ROOMS[package]
                if rooms.index(target_room) < rooms.index(room):
                    upward[f"{package}: {room or '(base)'} -> {target_room or '(base)'}"].append(
                        f"{module} -> {target}"
                    )
    assert dict(upward) == {}


def test_every_room_is_ordered() -> None:
    """A new subfolder takes its place in the order before it holds code."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name in mapping:
        parts = name.split(".")
        assert parts[1] in PACKAGES, name
        if len(parts) > 2:
            assert parts[2] in ROOMS.get(parts[1], []), f"{name} has no place in tests/test_layers.py's ROOMS"
