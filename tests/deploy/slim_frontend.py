"""Run openinfer-frontend as the slim frontend image would: only the packages it installs are importable.

``python tests/deploy/slim_frontend.py [openinfer-frontend arguments]``. deploy/Dockerfile.frontend installs
deploy/frontend-requirements.txt and openinfer itself with ``--no-deps``; here every other distribution of
this environment (torch, numpy, transformers, ...) fails to import, as it would in the image. Each refused
import is reported on stderr as ``slim-frontend: refused import of X (by MODULE)``; the tests fail on any
that openinfer itself tried.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from packaging.requirements import Requirement

REQUIREMENTS = Path(__file__).resolve().parents[2] / "deploy" / "frontend-requirements.txt"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_distributions(requirements: Path = REQUIREMENTS) -> set[str]:
    """openinfer, the requirements file's distributions and everything they depend on (canonical names)."""
    todo = [
        Requirement(line).name
        for line in requirements.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    seen = {"openinfer"}
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional dependency this environment lacks: the image would install it
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


class ImageOnlyPathFinder:
    """sys.meta_path's PathFinder, blind to top-level modules of distributions the image lacks.

    Such a module is simply not found: ``import numpy`` raises ModuleNotFoundError and
    ``importlib.util.find_spec("numpy")`` is None, as in the image.
    """

    def __init__(self, inner: Any, allowed: set[str]) -> None:
        self._inner = inner
        self._owners = {
            module: {_canonical(d) for d in dists}
            for module, dists in importlib.metadata.packages_distributions().items()
        }
        self._allowed = allowed

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        owners = self._owners.get(fullname)
        if "." not in fullname and owners and not owners & self._allowed:
            print(
                f"slim-frontend: refused import of {fullname} (by {_importer()})", file=sys.stderr, flush=True
            )
            return None
        return self._inner.find_spec(fullname, path, target)

    def invalidate_caches(self) -> None:
        self._inner.invalidate_caches()

    def find_distributions(self, *args: Any, **kwargs: Any) -> Any:
        """Installed distributions' metadata, as the image has it (its openinfer is pip-installed)."""
        return self._inner.find_distributions(*args, **kwargs)


def _importer() -> str:
    """The module whose code asked for the import: the first frame outside importlib and this file."""
    frame = sys._getframe(2)
    while frame.f_back is not None and (
        frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib"))
        or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
    return str(frame.f_globals.get("__name__"))


def main() -> None:
    allowed = image_distributions()
    sys.meta_path[:] = [
        ImageOnlyPathFinder(finder, allowed) if finder is importlib.machinery.PathFinder else finder
        for finder in sys.meta_path
    ]
    from openinfer.frontend.process.main import main as frontend_main

    sys.argv[0] = "openinfer-frontend"
    frontend_main()


if __name__ == "__main__":
    main()
