"""Hostile local processes against a real frontend with no keys: a garbage flood on the engine ports, forged
hellos on many indices, frames of millions of values (openinfer-serve's keys: test_serve_keys_e2e.py)."""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from openinfer.frontend.addresses import engine_addresses
from openinfer.frontend.engines.registry import MAX_ENGINES
from openinfer.frontend.engines.sockets import MAX_MESSAGE_BYTES
from openinfer.frontend.log_limit import BURST
from tests.e2e.frontend_reads import answers, counter, engines, errors_key, get, scrape, wait
from tests.e2e.processes import ADMIN_KEY, Cluster
from tests.e2e.stranger_frames import GARBAGE, forged_messages

# Never reached: strangers' records end when their connection closes, so counting them never races their expiry.
ENGINE_TIMEOUT_S = 120.0
FLOOD_S = 2.0


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
                {kind: after.get(errors_key(kind), 0) - before.get(errors_key(kind), 0) for kind in sent}
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
                return scrape(c).get(errors_key(kind), 0) - before.get(errors_key(kind), 0)

            wait(lambda: counted("invalid") == 1 and counted("version") == 1, 60, "both frames refused")
        finally:
            context.destroy(linger=0)
        grown = peak_rss_bytes(frontend.pid) - peak_before
        assert grown < 2 * MAX_MESSAGE_BYTES + 64 * 2**20, grown  # the two frames as received, and slack
        assert answers(c.url)
    finally:
        c.stop()
