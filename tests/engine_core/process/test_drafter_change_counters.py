"""A drafter change never takes drafts away from /metrics: an engine loop with two frontends (this test's
sockets) serves frontend 1's requests only while frontend 1 cycles the drafter (K 3 -> 5, unloaded, K 3 again
at once); every message frontend 0 (the metrics frontend) gets goes through a real FrontendMetrics, and its
/metrics equals the spec log bin by bin over the lines its counted seqs hold, with no protocol error."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from openinfer import protocol
from openinfer.engine_core.builtin_model import builtin_target_folder
from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.launch.local_cluster import free_port_pair
from openinfer.engine_core.process.engine_cli import load_runner
from openinfer.engine_core.process.engine_process import EngineProcess
from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.tools.delivered import Delivered
from openinfer.tools.spec_tally import read_spec_logs, tally_metrics

PROMPT = list(range(3, 35)) * 2  # the fake model's cycle, twice: n-gram lookup drafts from the first step
WAIT_S = 30.0  # a failure, never a hang


class Frontend:
    """One frontend's sockets: requests leave by a ROUTER, the engine's messages arrive on a PULL."""

    def __init__(self, context: zmq.Context, port: int) -> None:
        self.address = f"tcp://127.0.0.1:{port}"
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.bind(self.address)
        self.pull = context.socket(zmq.PULL)
        self.pull.bind(f"tcp://127.0.0.1:{port + 1}")
        self.received: list[protocol.EngineOutput] = []
        self._codec = protocol.EngineOutputCodec()

    def receive(self) -> protocol.EngineOutput:
        assert self.pull.poll(int(WAIT_S * 1000)), "the engine sent nothing"
        message = self._codec.decode(self.pull.recv())
        self.received.append(message)
        return message

    def drain(self) -> None:
        while self.pull.poll(0):
            self.receive()


class EngineUnderTest:
    """An engine loop in a thread (the fake model, n-gram K=3, a spec log) behind two frontends; frontend 1
    keeps two requests running (a finished one is replaced) and sends the drafter commands."""

    def __init__(self, folder: Path) -> None:
        first = free_port_pair(4)
        self.context = zmq.Context()
        self.frontends = [Frontend(self.context, first), Frontend(self.context, first + 2)]
        self.spec_log = folder / "spec.jsonl"
        config = EngineConfig(
            model_path=builtin_target_folder(), served_model_name="m", fake_model=True,
            frontend_addresses=tuple(f.address for f in self.frontends), heartbeat_interval=1.0,
            speculative=DrafterSpec("ngram", 3), spec_log=self.spec_log, step_sleep=0.002,
        )  # fmt: skip
        self.process = EngineProcess(config, EngineCore(config, load_runner(config), incarnation=7))
        self.identity = protocol.engine_identity(0, self.process.incarnation)
        self.thread = threading.Thread(target=self.process.run, daemon=True)
        self.thread.start()
        self._inputs = protocol.EngineInputCodec()
        self._next_request = 0
        for frontend in self.frontends:
            assert isinstance(frontend.receive(), protocol.EngineHello)
        self.send(self._request())
        self.send(self._request())

    def _request(self) -> protocol.EngineCoreRequest:
        self._next_request += 1
        params = protocol.SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        return protocol.EngineCoreRequest(f"r{self._next_request}", PROMPT, params)

    def send(self, message: protocol.EngineInput) -> None:
        """Send from frontend 1, retrying while the engine's DEALER is not connected yet."""
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                self.frontends[1].router.send_multipart([self.identity, self._inputs.encode(message)])
                return
            except zmq.ZMQError:
                assert time.monotonic() < deadline, "the engine never connected"
                time.sleep(0.01)

    def until(self, done: Callable[[protocol.EngineOutput], bool]) -> None:
        """Read frontend 1's messages (replacing finished requests) until one is ``done``."""
        while not done(message := self.frontends[1].receive()):
            if isinstance(message, protocol.EngineCoreOutputs):
                for _ in (o for o in message.outputs if o.finish is not None):
                    self.send(self._request())

    def command(self, command: protocol.LoadDrafter | protocol.UnloadDrafter) -> None:
        self.send(command)
        self.until(lambda m: isinstance(m, protocol.DrafterReply) and m.command_id == command.command_id)
        reply = self.frontends[1].received[-1]
        assert isinstance(reply, protocol.DrafterReply) and reply.ok, reply

    def drafts(self, at_least: int) -> None:
        """Until frontend 1 sees the counters hold ``at_least`` drafts."""
        self.until(lambda m: (s := m.load.spec_decode) is not None and s.num_drafts >= at_least)

    def stop(self) -> None:
        """Stop the engine loop; frontend 0 keeps what reached it (what did not is an unsent tail)."""
        self.process.stop()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the engine loop did not stop"
        self.frontends[0].drain()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineUnderTest]:
    under_test = EngineUnderTest(tmp_path)
    try:
        yield under_test
    finally:
        under_test.process.stop()
        under_test.thread.join(WAIT_S)
        under_test.context.destroy(linger=0)


def test_metrics_hold_every_draft_through_drafter_changes(engine: EngineUnderTest) -> None:
    """Three cycles of K=3 -> K=5 -> unloaded -> K=3 (reloaded at once, within a heartbeat interval), each
    after drafts were made for frontend 1's requests only: frontend 0's /metrics equals the spec log."""
    load = protocol.LoadDrafter
    for cycle in range(3):
        engine.drafts(at_least=20)
        engine.command(load(f"k5-{cycle}", "ngram", 5))
        engine.drafts(at_least=20)
        engine.command(protocol.UnloadDrafter(f"off-{cycle}"))
        engine.command(load(f"k3-{cycle}", "ngram", 3))
    engine.drafts(at_least=20)
    engine.stop()

    metrics = FrontendMetrics()
    for message in engine.frontends[0].received:  # as the metrics frontend's engine client takes them
        if isinstance(message, protocol.EngineHello):
            metrics.engine_joined(message.engine_index, message.incarnation)
        if isinstance(message, protocol.EngineHello | protocol.EngineCoreOutputs | protocol.DrafterReply):
            metrics.observe_message(message.engine_index, message.incarnation, message.seq, "m", message.load)
    delivered = Delivered.from_json({"counted_seqs": metrics.counted_seqs.to_json()})
    logs = read_spec_logs([engine.spec_log], delivered=delivered)
    # the six drafters replaced or unloaded made 20 drafts each at least, all counted (the last one's tail
    # after frontend 0's last message is not)
    assert not logs.malformed and logs.engines[0].num_drafts >= 6 * 20
    text = generate_latest(metrics.registry).decode()
    assert tally_metrics(text) == logs.engines
    errors = [s for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "openinfer:protocol_errors_total" and s.value]  # fmt: skip
    assert not errors, errors  # a reload of the same K read as a counter that went down would be one
