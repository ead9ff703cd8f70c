"""A bad view in the peers folder of ``openinfer-serve --api-server-count 2``, with real processes: /metrics of
the shared port still answers (issue 39, item 5)."""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgspec

from openinfer.frontend.metrics.api_servers import ApiServerView
from tests.e2e.processes import cmdline
from tests.e2e.serve_under_test import Serve, wait_for_state


def scrape(url: str, timeout: float = 60.0) -> tuple[int, str]:
    """The status and body of the first scrape of ``url`` that is answered (a connection a stopped api server
    holds is given up after 10 s and another made)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError:
            assert time.monotonic() < deadline, f"no scrape of {url} answered in {timeout} s"


def test_a_garbage_view_of_a_silent_api_server_leaves_metrics_answering(tmp_path: Path) -> None:
    """Api server 1 stopped (SIGSTOP: it answers nothing on its socket), its last view file replaced by a view
    whose exposition is garbage: each scrape of the shared port answers 200 with api server 0's engine 0 and
    without the garbage view (engine 1's series are in it alone), which is counted as a peer_view error."""
    serve = Serve(tmp_path, "--engines", "2", "--api-server-count", "2", api_servers=2)
    stopped = None
    try:
        serve.wait_serving()
        argv = cmdline(serve.wait_for("api-server0"))
        peers = Path(next(a.split("=", 1)[1] for a in argv if a.startswith("--peers-dir=")))
        assert scrape(serve.cluster.url)[0] == 200  # every api server's view file is written
        stopped = serve.wait_for("api-server1")
        os.kill(stopped, signal.SIGSTOP)
        wait_for_state(stopped, "T")
        garbage = ApiServerView("this is not an exposition {\n", {})
        (peers / "api-server-1.view").write_bytes(msgspec.msgpack.encode(garbage))
        answers = [scrape(serve.cluster.url) for _ in range(2)]
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        serve.close()
    assert [status for status, _ in answers] == [200, 200], answers[0][1][-2000:]
    for _, text in answers:
        assert 'openinfer:engine_up{engine="0"} 1.0' in text
        assert 'openinfer:engine_up{engine="1"}' not in text
    assert 'openinfer:protocol_errors_total{kind="peer_view"}' in answers[1][1]
