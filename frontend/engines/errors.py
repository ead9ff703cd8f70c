"""What the engine client raises to the API: no engine, overload, a command without an answer."""

from __future__ import annotations


class NoEngineError(Exception):
    """No live engine serves the requested model (or has the requested index)."""


class EngineOverloadedError(Exception):
    """The frontend's bound on unfinished requests is reached (in total, or on every engine of the model)."""

    retry_after_s = 1  # what the HTTP answer's Retry-After says


class EngineCommandError(Exception):
    """A command reached no answer: the engine was unreachable, restarted, or the frontend is closing."""
