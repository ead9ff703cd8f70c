"""The sweep's servers: ``openinfer-serve`` started on free loopback ports with one drafter, stopped by pid."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from openinfer.engine_core.launch.local_cluster import LocalCluster

DEFAULT_K = 7
STOP_TIMEOUT_S = 30.0  # openinfer-serve SIGKILLs its children after 10 s of SIGTERM


@dataclass(frozen=True)
class Drafter:
    """A drafter as the sweep names it: ``none``, ``ngram[:K=7]``, ``dflash[:PATH][:K=7]`` or
    ``dspark[:PATH][:K=7]`` (without PATH: the server's own, the built-in drafter of that method when it
    serves the built-in model), each but none optionally ending ``:adaptive``
    (``--enable-adaptive-verification``; without it ``--no-enable-adaptive-verification``, every draft
    verified, whatever the engine's default for the method)."""

    label: str  # as given on the command line
    method: str | None  # openinfer-serve --spec-method; None: no speculation
    num_spec_tokens: int | None
    draft_model: Path | None
    adaptive: bool = False

    def serve_args(self) -> list[str]:
        if self.method is None:
            return ["--no-spec"]  # openinfer-serve drafts by default with the built-in model
        args = ["--spec-method", self.method, "--num-spec-tokens", str(self.num_spec_tokens)]
        args += ["--draft-model", str(self.draft_model)] if self.draft_model else []
        return args + [f"--{'' if self.adaptive else 'no-'}enable-adaptive-verification"]


def parse_drafter(text: str) -> Drafter:
    """``none``, ``ngram[:K=N]``, ``dflash[:PATH][:K=N]`` or ``dspark[:PATH][:K=N]``, then optionally
    ``:adaptive`` (K defaults to 7); ``ValueError`` otherwise."""
    usage = f"drafter {text!r}: use none, ngram[:K=N], dflash[:PATH][:K=N] or dspark[:PATH][:K=N], then [:adaptive]"
    if text == "none":
        return Drafter(text, None, None, None)
    parts = text.split(":")
    adaptive = len(parts) > 1 and parts[-1] == "adaptive"
    if adaptive:
        parts.pop()
    k = DEFAULT_K
    if len(parts) > 1 and parts[-1].startswith("K="):
        value = parts.pop().removeprefix("K=")
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{usage} (K is a positive integer)")
        k = int(value)
    if parts in (["ngram"], ["dflash"], ["dspark"]):
        return Drafter(text, parts[0], k, None, adaptive)
    if len(parts) >= 2 and parts[0] in ("dflash", "dspark") and all(parts[1:]):
        return Drafter(text, parts[0], k, Path(":".join(parts[1:])), adaptive)
    raise ValueError(usage)


class LocalServer:
    """``openinfer-serve`` with one drafter, its engines' spec logs and its output under ``log_dir``.

    A context manager: entering starts it and waits for every engine; leaving stops it (SIGTERM to its pid,
    SIGKILL after ``STOP_TIMEOUT_S``).
    """

    def __init__(
        self,
        drafter: Drafter,
        log_dir: Path,
        model: Path | None,
        engines: int,
        device: str,
        extra_args: list[str],
        startup_timeout: float,
    ) -> None:
        self.drafter = drafter
        self.spec_log_dir = log_dir / "spec-logs"
        self.engines = engines
        self.startup_timeout = startup_timeout
        self.cluster = LocalCluster(log_dir)
        self.url = self.cluster.url
        self.args = ["--engines", str(engines), "--device", device, "--log-level", "warning"]
        self.args += ["--spec-log-dir", str(self.spec_log_dir), *drafter.serve_args(), *extra_args]
        if model is not None:
            self.args += ["--model", str(model)]

    def __enter__(self) -> LocalServer:
        self.spec_log_dir.mkdir(parents=True, exist_ok=True)
        self.cluster.start_serve(*self.args)
        try:
            self.cluster.wait_healthy(self.startup_timeout, self.engines)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        self.cluster.stop(STOP_TIMEOUT_S)
