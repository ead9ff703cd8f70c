"""Where drafters loaded at run time may come from (``--allowed-drafter-dir``).

The admin API's load-drafter command names a folder on the engine's host. The engine loads it only if it
lies under an allowed folder once symlinks and ``..`` are resolved, and its answers never tell the client
whether a path exists: a refused path and a missing or unreadable checkpoint read the same to it (the
engine's log says which).
"""

from __future__ import annotations

from pathlib import Path

NOT_ALLOWED = (
    "draft_model {path!r} is not under a folder this engine loads drafters from (--allowed-drafter-dir)"
)
CANNOT_LOAD = "cannot load a drafter from the path given ({path!r}); the engine's log says why"


def default_drafter_folders(model_path: Path, draft_model: Path | None) -> tuple[Path, ...]:
    """The folders that hold the engine's model and its start-time draft model (for the built-in pair:
    the package's ``builtin/`` folder, which holds both). A filesystem root is never a default."""
    folders: list[Path] = []
    for checkpoint in (model_path, draft_model):
        if checkpoint is None:
            continue
        parent = checkpoint.resolve().parent
        if parent != Path(parent.anchor) and parent not in folders:
            folders.append(parent)
    return tuple(folders)


def is_allowed(draft_model: str, allowed: tuple[Path, ...]) -> bool:
    """Whether ``draft_model`` (as the client sent it; relative to the engine's working folder) resolves
    to a path inside one of ``allowed``. Nothing is read but the links on the way."""
    try:
        path = Path(draft_model).resolve()
    except (OSError, ValueError):  # a NUL byte, a loop of links: no folder holds it
        return False
    return any(path.is_relative_to(folder.resolve()) for folder in allowed)
