"""CurveZMQ: engines with keys made by openinfer-keys serve; a stranger, keyless or with a key the frontend
does not admit, gets no frame to the frontend's decoder and moves no counter."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth

from openinfer.frontend.addresses import engine_addresses
from tests.e2e.frontend_reads import errors_key, wait
from tests.e2e.load import counter_samples
from tests.e2e.processes import ADMIN_HEADERS, ADMIN_KEY, HOST, Cluster
from tests.e2e.stranger_frames import forged_messages


@pytest.fixture(scope="module")
def curve_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    """Keys for a frontend and two engines; the frontend and engine 0 use them."""
    logs = tmp_path_factory.mktemp("curve")
    keys = logs / "keys"
    made = subprocess.run(
        [sys.executable, "-m", "openinfer.tools.curve_keys", str(keys), "--engines", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    c = Cluster(logs)
    try:
        c.start_frontend("--zmq-curve-keys", str(keys), "--admin-api-key", ADMIN_KEY)
        c.start_fake_engine(
            0, "--zmq-curve-keys", str(keys), "--spec-method", "ngram", "--num-spec-tokens", "3"
        )
        c.wait_healthy()
        yield c, keys
    finally:
        c.stop()


def scrape(c: Cluster) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"{c.url}/metrics", timeout=5) as r:
        return counter_samples(r.read().decode())


def admin_engines(c: Cluster) -> list[dict]:  # type: ignore[type-arg]
    request = urllib.request.Request(f"{c.url}/admin/engines", headers=ADMIN_HEADERS)
    with urllib.request.urlopen(request, timeout=5) as r:
        return list(json.load(r)["engines"])


def incarnation(c: Cluster) -> str:
    return str(admin_engines(c)[0]["incarnation"])


def engines(c: Cluster) -> list[int]:
    return [e["index"] for e in admin_engines(c)]


def test_engine_with_keys_serves(curve_cluster: tuple[Cluster, Path]) -> None:
    """The keyed engine joined and completes requests through the encrypted sockets; with keys the frontend
    warns of nothing."""
    c, _ = curve_cluster
    assert "SECURITY" not in (c.log_dir / "frontend.log").read_text()  # type: ignore[operator]
    body = json.dumps({"model": "fake", "prompt": "Hello", "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{c.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        assert json.load(r)["usage"]["completion_tokens"] == 8
    assert engines(c) == [0]


@pytest.mark.parametrize("stranger", ["keyless", "unknown_key"])
def test_stranger_cannot_inject(curve_cluster: tuple[Cluster, Path], stranger: str) -> None:
    """A PUSH without a key, or with a key pair the frontend never admitted: its hello and counters never
    reach the decoder (no engine 5, no counter but the failed handshakes moves), and a DEALER posing as
    engine 0 gets no request."""
    c, keys = curve_cluster
    before = scrape(c)
    addresses = engine_addresses(f"tcp://{HOST}:{c.engine_port}")
    context = zmq.Context()
    try:
        push, dealer = context.socket(zmq.PUSH), context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.ROUTING_ID, f"engine-0-{incarnation(c)}".encode())  # engine 0's own identity
        for socket in (push, dealer):
            socket.setsockopt(zmq.LINGER, 0)
            if stranger == "unknown_key":
                public, secret = zmq.curve_keypair()
                server, _ = zmq.auth.load_certificate(keys / "frontend.key")
                socket.curve_publickey, socket.curve_secretkey, socket.curve_serverkey = (
                    public,
                    secret,
                    server,
                )
        push.connect(addresses.outputs)
        dealer.connect(addresses.requests)
        for frame in forged_messages():
            try:  # the failed handshake tears the connection down: the frame may not even be queued
                push.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                pass
        handshakes = before.get(errors_key("handshake"), 0)
        # Both sockets' handshakes refused (the frontend counts each): what they sent can no longer arrive.
        wait(lambda: scrape(c).get(errors_key("handshake"), 0) >= handshakes + 2, 30, "both refused")
        after = scrape(c)
        assert engines(c) == [0]
        test_engine_with_keys_serves(curve_cluster)  # its requests still reach the real engine 0
        assert dealer.poll(100) == 0
    finally:
        context.destroy(linger=0)
    moved = {key for key in set(before) | set(after) if before.get(key) != after.get(key)}
    assert all(name == "openinfer:protocol_errors_total" for name, _ in moved), moved
    handshakes = ("openinfer:protocol_errors_total", (("kind", "handshake"),))
    assert after.get(handshakes, 0) > before.get(handshakes, 0)
