"""Hostile local processes against real frontends: a garbage flood on the engine ports, forged hellos on many
indices, a stranger sending as a live engine's incarnation under openinfer-serve, and the keys serve makes
by default so that only its own engines get in."""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.auth

from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engines.log_limit import BURST
from openinfer.frontend.engines.registry import MAX_ENGINES
from openinfer.frontend.engines.sockets import MAX_MESSAGE_BYTES
from openinfer.protocol import EngineCoreOutputs, EngineOutputCodec, LoadSnapshot
from tests.e2e.load import counter_samples
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, Cluster, cmdline, serve_children
from tests.e2e.test_curve import forged_messages

# Never reached: strangers' records end when their connection closes, so counting them never races their expiry.
ENGINE_TIMEOUT_S = 120.0
FLOOD_S = 2.0


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 50 ms; fail saying ``what`` if it is not true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
        return bytes(r.read())


def scrape(c: Cluster) -> dict:  # type: ignore[type-arg]
    return counter_samples(get(f"{c.url}/metrics").decode())


def counter(c: Cluster, name: str, **labels: str) -> float:
    return float(scrape(c).get((name, tuple(sorted(labels.items()))), 0.0))


def engines(c: Cluster) -> dict[int, dict]:  # type: ignore[type-arg]
    return {e["index"]: e for e in json.loads(get(f"{c.url}/admin/engines", ADMIN_HEADERS))["engines"]}


def answers(url: str) -> bool:
    """Whether HTTP answers at all (/health is 503 without engines)."""
    try:
        get(f"{url}/health")
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A frontend started alone, without keys, and no engine: strangers are all it hears."""
    c = Cluster(tmp_path_factory.mktemp("alone"))
    try:
        c.start_frontend("--engine-timeout", str(ENGINE_TIMEOUT_S), "--admin-api-key", ADMIN_KEY)
        wait(lambda: answers(c.url), 30, "the frontend listening")
        yield c
    finally:
        c.stop()


class HealthProbe:
    """GET /health every 0.1 s in a thread until stopped; each answer (any status) must come within 5 s."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answered = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5):
                    pass
            except urllib.error.HTTPError:
                pass  # 503: no engine, an answer all the same
            except OSError as e:
                self.failures.append(repr(e))
                continue
            self.answered += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# Garbage of each kind the frontend counts, as frames sent on the outputs port.
GARBAGE = {
    "undecodable": [b"\xc1garbage"],
    "invalid": [msgspec.msgpack.encode(["out", 0, 1])],  # an outputs message missing its fields
    "frames": [b"one", b"two"],
    "version": [msgspec.msgpack.encode(["hello", 98])],  # another version's hello, naming no engine
}


def test_a_garbage_flood_is_counted_in_full_and_logged_a_few_lines_a_second(alone: Cluster) -> None:
    """Garbage of four kinds on the outputs port as fast as a process sends it for 2 s, and some on the
    request socket: every frame is counted under its kind, /health answers throughout, and each kind gets
    at most BURST lines plus one a second in the frontend's log."""
    c = alone
    addresses = engine_addresses(c.engine_address)
    log_file = c.log_dir / "frontend.log"
    log_start = log_file.stat().st_size
    before = scrape(c)
    sent: Counter[str] = Counter()
    context = zmq.Context()
    probe = HealthProbe(c.url)
    try:
        push, dealer = context.socket(zmq.PUSH), context.socket(zmq.DEALER)
        push.connect(addresses.outputs)
        dealer.connect(addresses.requests)
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_S:
            for kind, frames in GARBAGE.items():
                push.send_multipart(frames)
                sent[kind] += 1
            if sent["frames"] % 100 == 0:
                dealer.send(b"stray")
                sent["unexpected"] += 1

        def counted() -> Counter[str]:
            after = scrape(c)
            return Counter(
                {kind: after.get(_errors(kind), 0) - before.get(_errors(kind), 0) for kind in sent}
            )

        wait(lambda: counted() == sent, 120, f"{dict(sent)} counted")
        finished = time.monotonic()
    finally:
        probe.stop()
        context.destroy(linger=0)
    assert probe.failures == [] and probe.answered > 0
    refused = ("openinfer:engine_hellos_refused_total", (("engine", "unknown"), ("reason", "version")))
    assert scrape(c).get(refused, 0) - before.get(refused, 0) == sent["version"]

    with log_file.open("rb") as f:
        f.seek(log_start)
        log = f.read().decode(errors="replace")
    most = BURST + math.ceil(finished - started) + 1  # the refill: one line a second
    for kind in GARBAGE:
        lines = len(re.findall(rf"dropped a bad frame from an engine: {kind}:", log))
        assert 1 <= lines <= most, (kind, lines, most)
    strays = log.count("on the request socket, where engines never send")
    assert 1 <= strays <= most
    assert sum(sent.values()) > 10 * len(log.splitlines())  # (some 100,000 frames, a few dozen lines)


def _errors(kind: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return "openinfer:protocol_errors_total", (("kind", kind),)


def test_forged_hellos_on_many_indices_are_bounded_and_forgotten(alone: Cluster) -> None:
    """Hellos for MAX_ENGINES + 44 distinct indices from a stranger, then its connection closes: at most
    MAX_ENGINES engines listed (the others refused, counted under engine "unknown"), and once the records
    are seen dead none, with no series of those indices left in /metrics."""
    c = alone
    hello = msgspec.msgpack.decode(forged_messages()[0])  # engine 5's hello, as a list to vary
    indices = range(10_000, 10_000 + MAX_ENGINES + 44)
    refused_before = counter(
        c, "openinfer:engine_hellos_refused_total", engine="unknown", reason="too_many_engines"
    )
    context = zmq.Context()
    try:
        push = context.socket(zmq.PUSH)
        push.connect(engine_addresses(c.engine_address).outputs)
        for index in indices:
            hello[2], hello[3] = index, index  # engine_index, incarnation
            push.send(msgspec.msgpack.encode(hello))

        def refused() -> float:
            labels = {"engine": "unknown", "reason": "too_many_engines"}
            return counter(c, "openinfer:engine_hellos_refused_total", **labels) - refused_before

        wait(lambda: refused() == 44, 60, "44 hellos refused")
        assert len(engines(c)) == MAX_ENGINES
        exported = get(f"{c.url}/metrics").decode()
        assert len(set(re.findall(r'engine="(1\d{4})"', exported))) == MAX_ENGINES
    finally:
        context.destroy(linger=0)  # the records' connection closes: each is down within about a second
    wait(lambda: engines(c) == {}, 30, "the forged engines forgotten")
    assert re.findall(r'engine="(1\d{4})"', get(f"{c.url}/metrics").decode()) == []


def peak_rss_bytes(pid: int) -> int:
    """A process's peak resident memory so far (VmHWM, Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


def test_a_frame_of_millions_of_values_is_refused_without_building_them(tmp_path: Path) -> None:
    """Two frames of nearly MAX_MESSAGE_BYTES, one msgpack array of nils each (the second starting as
    another version's hello), to a frontend of its own: each is refused and counted, and the frontend's peak
    memory grows by less than the frames themselves would as lists (8 bytes an item: over 500 MB)."""
    c = Cluster(tmp_path)
    try:
        frontend = c.start_frontend()
        wait(lambda: answers(c.url), 30, "the frontend listening")
        before, peak_before = scrape(c), peak_rss_bytes(frontend.pid)
        n = MAX_MESSAGE_BYTES - 64  # values, one byte each
        array = b"\xdd" + n.to_bytes(4, "big")  # msgpack array32 header
        nils = array + b"\xc0" * n
        foreign = array + msgspec.msgpack.encode("hello") + msgspec.msgpack.encode(98) + b"\xc0" * (n - 2)
        context = zmq.Context()
        try:
            push = context.socket(zmq.PUSH)
            push.connect(engine_addresses(c.engine_address).outputs)
            push.send(nils)
            push.send(foreign)
            del nils, foreign

            def counted(kind: str) -> float:
                return scrape(c).get(_errors(kind), 0) - before.get(_errors(kind), 0)

            wait(lambda: counted("invalid") == 1 and counted("version") == 1, 60, "both frames refused")
        finally:
            context.destroy(linger=0)
        grown = peak_rss_bytes(frontend.pid) - peak_before
        assert grown < 2 * MAX_MESSAGE_BYTES + 64 * 2**20, grown  # the two frames as received, and slack
        assert answers(c.url)
    finally:
        c.stop()


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Cluster, subprocess.Popen[bytes], Path]]:
    """``openinfer-serve`` with one fake engine (n-gram drafts, a spec log, a state dir) and no
    --zmq-curve-keys; engines restarted 0.2 s after a death. Yields the cluster, serve, and the root
    folder (``spec/``, ``state/``)."""
    root = tmp_path_factory.mktemp("served")
    c = Cluster(root / "logs")
    try:
        serve = c.start_serve_fake(
            "--spec-method", "ngram", "--num-spec-tokens", "3", "--spec-log-dir", str(root / "spec"),
            "--state-dir", str(root / "state"), "--engine-restart-backoff", "0.2", "--admin-api-key", ADMIN_KEY,
        )  # fmt: skip
        c.wait_healthy(90)
        yield c, serve, root
    finally:
        c.stop(30)


def key_folder(serve: subprocess.Popen[bytes]) -> Path:
    """The --zmq-curve-keys folder serve gave its frontend."""
    [flag] = [
        arg for arg in cmdline(serve_children(serve.pid)["frontend"]) if arg.startswith("--zmq-curve-keys=")
    ]
    return Path(flag.split("=", 1)[1])


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_serve_makes_private_keys_and_a_keyless_process_cannot_join(
    served: tuple[Cluster, subprocess.Popen[bytes], Path],
) -> None:
    """Without --zmq-curve-keys serve makes keys in a private folder (0700, secret files 0600), gives its
    frontend and engine the folder, never a key, on their command lines or in their environments; a keyless
    process's hello and counters never reach the registry: only the failed handshakes are counted."""
    c, serve, _ = served
    folder = key_folder(serve)
    assert mode(folder) == 0o700 and mode(folder / "engines") == 0o700
    secrets = sorted(folder.rglob("*.key_secret"))
    assert sorted(p.name for p in secrets) == ["engine-0.key_secret", "frontend.key_secret"]
    assert all(mode(p) == 0o600 for p in secrets)
    for pid in serve_children(serve.pid).values():
        assert f"--zmq-curve-keys={folder}" in cmdline(pid)
        shown = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
        for secret in secrets:
            _, key = zmq.auth.load_certificate(secret)
            assert key is not None and key not in shown

    before = scrape(c)
    context = zmq.Context()
    try:
        push = context.socket(zmq.PUSH)
        push.connect(engine_addresses(c.engine_address).outputs)
        for frame in forged_messages():
            try:  # the failed handshake tears the connection down: the frame may not even be queued
                push.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                pass
        wait(
            lambda: scrape(c).get(_errors("handshake"), 0) > before.get(_errors("handshake"), 0),
            30,
            "refused",
        )
    finally:
        context.destroy(linger=0)
    assert list(engines(c)) == [0]
    after = scrape(c)
    moved = {
        name
        for name, labels in set(before) | set(after)
        if before.get((name, labels)) != after.get((name, labels))
    }
    assert moved <= {"openinfer:protocol_errors_total"}, moved


def test_spec_logs_and_the_state_file_are_private(
    served: tuple[Cluster, subprocess.Popen[bytes], Path],
) -> None:
    """The engine's spec log and the frontend's state file are 0600, in folders made 0700: the incarnations
    they name are what a stranger needs to pose as an engine."""
    c, _, root = served
    get(f"{c.url}/metrics")  # the state is saved before a scrape is answered
    assert mode(root / "spec") == 0o700 and mode(root / "spec" / "spec-engine0.jsonl") == 0o600
    assert mode(root / "state") == 0o700 and mode(root / "state" / "frontend-state.json") == 0o600


def test_a_stranger_sending_as_a_live_engine_gets_it_replaced(
    served: tuple[Cluster, subprocess.Popen[bytes], Path],
) -> None:
    """A process holding the keys sends one message as engine 0's live incarnation with seq 2^63-1: the
    engine's own messages, now behind, are dropped and counted (kind "seq") and, as they go on, the frontend
    retires the incarnation and tells the engine, which exits 3; serve starts it again, the new incarnation
    is taken and serves."""
    c, serve, _ = served
    first = engines(c)[0]["incarnation"]
    public, secret = zmq.auth.load_certificate(key_folder(serve) / "engines" / "engine-0.key_secret")
    server, _ = zmq.auth.load_certificate(key_folder(serve) / "frontend.key")
    forged = EngineCoreOutputs(0, int(first, 16), 2**63 - 1, time.time(), [], LoadSnapshot(0, 2048, 0, 0))
    context = zmq.Context()
    try:
        push = context.socket(zmq.PUSH)
        push.curve_publickey, push.curve_secretkey, push.curve_serverkey = public, secret, server
        push.connect(engine_addresses(c.engine_address).outputs)
        push.send(EngineOutputCodec().encode(forged))

        def replaced() -> bool:
            engine = engines(c).get(0)
            return engine is not None and engine["incarnation"] != first and engine["up"]

        wait(replaced, 90, "engine 0 replaced")
    finally:
        context.destroy(linger=0)
    log = (c.log_dir / "serve.log").read_text(errors="replace")
    assert "engine 0 exited with code 3" in log
    assert log.count("two processes send as this incarnation") >= 2  # the frontend's line, the engine's
    assert counter(c, "openinfer:protocol_errors_total", kind="seq") >= 2  # a run of them, 1 s long
    assert counter(c, "openinfer:engine_restarts_total", engine="0") == 1
    body = json.dumps({"model": "fake", "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{c.url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert json.load(r)["usage"]["completion_tokens"] == 4


def test_serve_removes_its_keys_when_it_stops(tmp_path: Path) -> None:
    """SIGTERM: serve (one of its own) exits 0 and the key folder it made is gone."""
    c = Cluster(tmp_path)
    try:
        serve = c.start_serve_fake()
        c.wait_healthy(90)
        folder = key_folder(serve)
        assert folder.is_dir()
        serve.terminate()
        assert serve.wait(30) == 0
        assert not folder.exists()
    finally:
        c.stop()
