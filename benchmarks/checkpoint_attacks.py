"""Issue 39's hostile checkpoints against ``openinfer-serve --model BAD``: an attack on serve's start, run
alone (a row per damage, below) or as ``attacks.py``'s ``bad_checkpoints`` row (every damage started beside
the running server: how they ended, and what starting them did to it).

For each damage of :mod:`openinfer.engine_core.testing.hostile_checkpoints`, a copy of a tiny two-shard
checkpoint is damaged and ``openinfer-serve`` started on it (free loopback ports, ``--startup-timeout``); one
row says how serve ended (its exit status, or "running" when it was still up ``--startup-timeout`` + 30 s
later and was stopped by pid), after how many seconds, how often it started the engine again, and the
engine's error line. A bad checkpoint should end serve at once with status 1, no restart and a message
naming the file.

    python -m openinfer.benchmarks.checkpoint_attacks
    python -m openinfer.benchmarks.checkpoint_attacks --damages fifo truncated --startup-timeout 60
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from openinfer.benchmarks.attack_target import Target
from openinfer.engine_core.launch.local_cluster import LocalCluster
from openinfer.engine_core.testing.hostile_checkpoints import HOSTILE_CHECKPOINTS
from openinfer.engine_core.testing.tiny_model import SMALL_QWEN3, make_tiny_checkpoint

GRACE_S = 30.0  # past --startup-timeout, serve is stopped by pid
_ENGINE_ERROR = re.compile(r"^\S+ \S+ engine\d+ ERROR (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Outcome:
    """How ``openinfer-serve`` on one damaged checkpoint ended."""

    damage: str
    exit_code: int | None  # None: still running at the bound (then stopped)
    seconds: float  # from its start to its exit (or to the bound)
    restarts: int  # engine restarts serve logged
    message: str  # the engine's first ERROR line, "" when it logged none


def attack(base: Path, damage: str, folder: Path, startup_timeout: float) -> Outcome:
    """Damage a copy of ``base`` (a two-shard checkpoint) in ``folder`` and start serve on it."""
    model = Path(shutil.copytree(base, folder / "model", symlinks=True))
    HOSTILE_CHECKPOINTS[damage](model)
    cluster = LocalCluster(folder / "logs")
    started = time.monotonic()
    flags = ["--model", str(model), "--kv-cache-gb", "0.05", "--startup-timeout", str(startup_timeout)]
    try:
        process = cluster.start_serve(*flags)
        try:
            code: int | None = process.wait(startup_timeout + GRACE_S)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - started
    finally:
        cluster.stop(30)
    log = (folder / "logs" / "serve.log").read_text(errors="replace")
    errors = _ENGINE_ERROR.findall(log)
    return Outcome(damage, code, seconds, log.count("starting it again"), errors[0] if errors else "")


def attack_all(folder: Path, startup_timeout: float) -> list[Outcome]:
    """Every damage in turn, each on its own copy of one tiny checkpoint under ``folder``."""
    base = make_tiny_checkpoint(folder / "base", overrides=SMALL_QWEN3, num_shards=2)
    return [attack(base, damage, folder / damage, startup_timeout) for damage in HOSTILE_CHECKPOINTS]


async def bad_checkpoints(target: Target) -> str:
    """``attacks.py``'s row: every damaged checkpoint served beside ``target`` (``--startup-timeout 60``)."""
    with tempfile.TemporaryDirectory(prefix="openinfer-checkpoint-attacks-") as tmp:
        outcomes = await asyncio.to_thread(attack_all, Path(tmp), 60.0)
    stopped = [o for o in outcomes if o.exit_code == 1 and not o.restarts and o.message]
    others = ", ".join(
        f"{o.damage}: exit {o.exit_code}, {o.restarts} restarts" for o in outcomes if o not in stopped
    )
    seconds = [o.seconds for o in outcomes]
    return (
        f"{len(stopped)} of {len(outcomes)} damaged checkpoints ended serve with exit 1, the engine's message "
        f"and no restart, in {min(seconds):.1f}-{max(seconds):.1f} s" + (f"; {others}" if others else "")
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point: one row per damage."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--damages", nargs="+", choices=sorted(HOSTILE_CHECKPOINTS), default=None)
    parser.add_argument("--startup-timeout", type=float, default=120.0, help="serve's (default 120 s)")
    args = parser.parse_args(argv)
    print(f"{'damage':<26} {'ended':>8} {'seconds':>8} {'restarts':>8}  engine's message")
    with tempfile.TemporaryDirectory(prefix="openinfer-checkpoint-attacks-") as tmp:
        base = make_tiny_checkpoint(Path(tmp) / "base", overrides=SMALL_QWEN3, num_shards=2)
        for damage in args.damages or HOSTILE_CHECKPOINTS:
            outcome = attack(base, damage, Path(tmp) / damage, args.startup_timeout)
            ended = "running" if outcome.exit_code is None else f"exit {outcome.exit_code}"
            message = outcome.message.replace(f"{tmp}/", "")  # paths relative to the temporary folder
            print(
                f"{damage:<26} {ended:>8} {outcome.seconds:>8.1f} {outcome.restarts:>8}  {message[:120]}",
                flush=True,
            )


if __name__ == "__main__":
    main()
