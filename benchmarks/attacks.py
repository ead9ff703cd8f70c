"""Issue 25's and 39's attacks against a local ``openinfer-serve``, one after the other, and what each does
to others.

For a baseline window and then each attack of :mod:`openinfer.benchmarks.attackers`, starts a fresh
``openinfer-serve`` (the built-in model; free loopback ports; ``--spec-log-dir`` and ``--state-dir`` in a
temporary folder; the attack's own flags from ``attackers.SERVE_FLAGS``), runs the attack for about
``--seconds``, stops the server by pid whatever happens, and prints one table row:

- /health p50 / p99 / max latency, polled every 20 ms; the victim, a 2-token chat request and a 32-token
  completion one after the other: latencies and how many succeeded. Both run in a process of their own, so
  that an attacker's busy loop never delays them; a victim request still in flight when the attack ends is
  waited for (it is the stall being measured);
- the frontend's log lines and bytes written meanwhile (the server's output less the lines its engines and
  the launcher tag as theirs), ERROR and traceback lines among them, the frontend's RSS growth and the
  growth of the series count on /metrics;
- what the attack achieved, and /health and a completion right after it when they do not answer 200.

    python -m openinfer.benchmarks.attacks
    python -m openinfer.benchmarks.attacks --attacks garbage_flood forged_hellos --seconds 20
    python benchmarks/attacks.py --serve-arg=--max-queued-per-engine=64   # a flag for openinfer-serve
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from openinfer.benchmarks.attack_observer import Observation, Observer, Window, auth_headers
from openinfer.benchmarks.attackers import ATTACKERS, SERVE_FLAGS, Attacker, Target
from openinfer.engine_core.launch.local_cluster import HOST, LocalCluster, python_module, serve_children

ATTACK_GRACE_S = 60.0  # an attack still running this long after its time is stopped
STOP_TIMEOUT_S = 30.0  # openinfer-serve SIGKILLs its children after 10 s of SIGTERM
# Lines the engines ("... engine0 INFO ...") and openinfer-serve ("... serve INFO ...") tag as theirs.
_NOT_FRONTEND = re.compile(rb"^\S+ \S+ (engine\d+|serve) ")


# ---- the server ----


class Server:
    """``openinfer-serve`` (the built-in model unless ``serve_args`` say otherwise) on free loopback ports,
    its files and log in ``folder``; ``api_key`` reaches it in its environment, never its command line.
    A context manager: entering starts it and waits until it serves, leaving stops it by pid."""

    def __init__(self, folder: Path, serve_args: list[str], api_key: str | None, timeout: float) -> None:
        self.spec_log_dir, self.state_dir = folder / "spec-logs", folder / "state"
        self.log = folder / "serve.log"  # LocalCluster logs each child to folder/NAME.log
        self.api_key, self._serve_args, self._timeout = api_key, serve_args, timeout
        self.cluster = LocalCluster(folder)
        self.url = self.cluster.url

    def __enter__(self) -> Server:
        ports = ["--port", str(self.cluster.http_port), "--engine-port", str(self.cluster.engine_port)]
        files = ["--spec-log-dir", str(self.spec_log_dir), "--state-dir", str(self.state_dir)]
        argv = ["--host", HOST, *ports, *files, *self._serve_args]
        env = {"OPENINFER_API_KEY": self.api_key} if self.api_key else None
        self.spec_log_dir.mkdir(parents=True)
        started = time.monotonic()
        serve = self.cluster.spawn("serve", python_module("openinfer.engine_core.launch.serve", *argv), env)
        try:
            self.cluster.wait_healthy(self._timeout)
            self.model = json.loads(self.request("/v1/models")[1])["data"][0]["id"]
            if self.answers() != (200, 200):  # the first requests also add series to /metrics
                raise RuntimeError(f"openinfer-serve at {self.url} does not serve:\n{self.cluster.logs()}")
        except BaseException:
            self.cluster.stop(STOP_TIMEOUT_S)
            raise
        children = ", ".join(f"{role} {pid}" for role, pid in sorted(serve_children(serve.pid).items()))
        up = f"openinfer-serve pid {serve.pid} ({children}) at {self.url}, up in {time.monotonic() - started:.1f} s"
        print(up, file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cluster.stop(STOP_TIMEOUT_S)

    def frontend_pid(self) -> int | None:
        return serve_children(self.cluster.processes["serve"].pid).get("frontend")

    def request(self, path: str, body: object = None, timeout: float = 30.0) -> tuple[int, bytes]:
        """GET (``body`` None) or POST a route with the API key: (status, body); status 0 when none came."""
        headers = {"Content-Type": "application/json", **auth_headers(self.api_key)}
        request = urllib.request.Request(
            self.url + path, None if body is None else json.dumps(body).encode(), headers
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, b""
        except OSError:
            return 0, b""

    def answers(self) -> tuple[int, int]:
        """The statuses of /health and of a 2-token completion."""
        completion = {"model": self.model, "prompt": "ROMEO:", "max_tokens": 2}
        return self.request("/health")[0], self.request("/v1/completions", completion)[0]


# ---- one attack's row ----


@dataclass(frozen=True)
class Snapshot:
    """The server's log size, the frontend's pid and resident memory, and the series on /metrics."""

    log_bytes: int
    frontend_pid: int | None
    rss_bytes: int
    series: int

    @classmethod
    def take(cls, server: Server) -> Snapshot:
        pid, rss = server.frontend_pid(), 0
        if pid is not None:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            rss = int(next(line.split()[1] for line in status if line.startswith("VmRSS:"))) * 1024
        lines = server.request("/metrics", timeout=60)[1].splitlines()
        return cls(server.log.stat().st_size, pid, rss, sum(1 for line in lines if line and line[:1] != b"#"))


@dataclass(frozen=True)
class FrontendLog:
    """The frontend's log lines between two offsets of the server's log."""

    lines: int
    bytes: int
    errors: int  # ERROR lines and tracebacks

    @classmethod
    def read(cls, path: Path, start: int, end: int) -> FrontendLog:
        with path.open("rb") as log:
            log.seek(start)
            lines = [line for line in log.read(end - start).splitlines(True) if not _NOT_FRONTEND.match(line)]
        errors = sum(b" ERROR " in line or line.startswith(b"Traceback") for line in lines)
        return cls(len(lines), sum(map(len, lines)), errors)


@dataclass(frozen=True)
class Row:
    """One attack's measurements."""

    attack: str
    seen: Observation
    log: FrontendLog
    rss_growth: int | None  # None: another frontend process by the end (restarted)
    series_growth: int
    outcome: str


async def _attack(attacker: Attacker, server: Server, options: argparse.Namespace) -> str:
    limit = max(options.seconds, options.idle_seconds) + ATTACK_GRACE_S
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, headers=auth_headers(server.api_key)) as session:
        target = Target(
            session, HOST, server.cluster.http_port, server.api_key, server.model, server.cluster.engine_port,
            server.spec_log_dir, server.state_dir, options.seconds, options.idle_seconds, options.body_mb,
            options.schema_depth, options.hellos, server.cluster.processes["serve"].pid,
        )  # fmt: skip
        try:
            return await asyncio.wait_for(attacker(target), limit)
        except TimeoutError:
            return f"the attack did not end within {limit:g} s"
        except Exception as e:  # noqa: BLE001 - the run goes on, and the row says why this attack stopped
            return f"the attack stopped: {type(e).__name__}: {e}"


async def _no_attack(target: Target) -> str:
    return "no attack"


def measure(
    name: str, attacker: Attacker, server: Server, observer: Observer, options: argparse.Namespace
) -> Row:
    """One attack's row, observed for ``--seconds`` at least."""
    observer.begin(Window(server.url, server.model, server.api_key))
    before, started = Snapshot.take(server), time.monotonic()
    outcome = asyncio.run(_attack(attacker, server, options))
    time.sleep(max(0.0, options.seconds - (time.monotonic() - started)))
    seen = observer.end()
    after, (health, completion) = Snapshot.take(server), server.answers()
    if (health, completion) != (200, 200):
        outcome += f"; afterwards /health {health}, a completion {completion}"
    log = FrontendLog.read(server.log, before.log_bytes, after.log_bytes)
    rss = after.rss_bytes - before.rss_bytes if after.frontend_pid == before.frontend_pid else None
    return Row(name, seen, log, rss, after.series - before.series, outcome)


# ---- the table ----

HEADER = (
    "| attack | /health p50 / p99 / max ms | chat 2 tok p50 / max s | completion 32 tok p50 / max s "
    "| victim ok / failed | log lines | log MB | ERROR lines | RSS +MB | series + | outcome |"
)


def _quantiles(values: list[float], quantiles: tuple[float, ...], digits: int) -> str:
    ordered = sorted(values)
    cells = [f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.{digits}f}" for q in quantiles]
    return " / ".join(cells) if values else "-"


def format_row(row: Row) -> str:
    seen = row.seen
    health = _quantiles(seen.health_ms, (0.5, 0.99, 1.0), 1)
    health += f" ({seen.health_not_200} not 200)" if seen.health_not_200 else ""
    cells = [
        row.attack, health, _quantiles(seen.chat_s, (0.5, 1.0), 2), _quantiles(seen.completion_s, (0.5, 1.0), 2),
        f"{seen.victim_ok} / {seen.victim_failed}", f"{row.log.lines:,}", f"{row.log.bytes / 1e6:.2f}",
        f"{row.log.errors:,}", f"{row.rss_growth / 1e6:+.1f}" if row.rss_growth is not None else "restarted",
        f"{row.series_growth:+,}", row.outcome,
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def format_table(rows: list[Row]) -> str:
    return "\n".join([HEADER, "|" + "---|" * HEADER.count(" | ") + "---|", *map(format_row, rows)])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--attacks", nargs="+", choices=list(ATTACKERS), default=list(ATTACKERS), metavar="ATTACK",
        help=f"which attacks, in this order (default: all: {' '.join(ATTACKERS)})")  # fmt: skip
    add("--seconds", type=float, default=5.0, help="how long each attack runs (default: 5)")
    add("--idle-seconds", type=float, default=15.0, help="how long slow and idle connections are held (15)")
    add("--body-mb", type=float, default=16.0, help="the size of each big body, in MB (16)")
    add("--schema-depth", type=int, default=300, help="nesting of the slow JSON schemas (300)")
    add("--hellos", type=int, default=5000, help="forged hellos of distinct engine indices, at most (5000)")
    add("--serve-arg", action="append", default=[], metavar="FLAG",
        help="a flag for openinfer-serve, as --serve-arg=--flag=value (repeat for more)")  # fmt: skip
    add("--api-key", help="start the servers with this API key (the \\xff in Authorization case needs one)")
    add("--startup-timeout", type=float, default=180.0, help="seconds to wait for each server (180)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m openinfer.benchmarks.attacks`` (see the module's docstring)."""
    options = parse_args(argv)
    rows: list[Row] = []
    observer = Observer()
    try:
        with tempfile.TemporaryDirectory(prefix="openinfer-attacks-") as folder:
            for name in ["baseline", *options.attacks]:
                own = SERVE_FLAGS.get(name, [])
                flags = [*options.serve_arg, *(own(Path(folder)) if callable(own) else own)]
                server = Server(Path(folder) / name, flags, options.api_key, options.startup_timeout)
                with server:
                    rows.append(measure(name, ATTACKERS.get(name, _no_attack), server, observer, options))
                print(format_row(rows[-1]), file=sys.stderr, flush=True)
    finally:
        observer.close()
    print(format_table(rows))


if __name__ == "__main__":
    main()
