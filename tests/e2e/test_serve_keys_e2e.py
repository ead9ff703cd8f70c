"""openinfer-serve's keys: made by default so that only its own engines get in, private like its spec logs and
state file, removed when it stops; a stranger holding them and sending as a live engine's incarnation gets
that engine replaced."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth

from openinfer.frontend.addresses import engine_addresses
from openinfer.protocol import EngineCoreOutputs, EngineOutputCodec, LoadSnapshot
from tests.e2e.frontend_reads import counter, engines, errors_key, get, scrape, wait
from tests.e2e.processes import ADMIN_KEY, Cluster, cmdline, serve_children
from tests.e2e.stranger_frames import forged_messages


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
            lambda: scrape(c).get(errors_key("handshake"), 0) > before.get(errors_key("handshake"), 0),
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
