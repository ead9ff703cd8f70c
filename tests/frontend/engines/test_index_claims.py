"""Engine identity is not first come, last served: a live engine keeps its index against a stranger's hello,
a restarted engine (its predecessor's connection gone, or silent past the timeout) is taken back at once."""

from __future__ import annotations

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.engines.engine_requests import make_request
from tests.frontend.frontends import FrontendFactory, PeerFactory
from tests.frontend.waits import wait_until


def sample(metrics: FrontendMetrics, name: str, labels: dict[str, str]) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_stranger_with_a_live_engines_index_is_refused(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """A second engine 0 while the first heart-beats: HelloRefused saying why, counted; the first keeps the
    index and every request; the stranger's outputs are dropped as protocol errors and the refusal repeated."""
    frontend = await start_frontend()
    first = await start_peer(frontend, PeerConfig(model_name="tiny"))
    stranger = await start_peer(frontend, PeerConfig(model_name="stranger"), wait=False)
    await wait_until(lambda: len(stranger.refusals) == 1, timeout=3)
    assert "engine index 0 is held by a live engine" in stranger.refusals[0]
    assert f"incarnation {first.incarnation:016x}" in stranger.refusals[0]
    registry = frontend.client.registry
    assert registry.current(0, first.incarnation) is not None and registry.is_refused(0, stranger.incarnation)
    labels = {"engine": "0", "reason": "engine_alive"}
    assert sample(frontend.metrics, "openinfer:engine_hellos_refused_total", labels) == 1
    assert [model.name for model in frontend.client.served_models()] == ["tiny"]  # never "stranger"
    for i in range(4):
        stream = await frontend.client.add_request(make_request(f"r{i}"), "tiny")
        assert len([output async for output in stream]) == 3
    assert sorted(first.requests) == ["r0", "r1", "r2", "r3"] and stranger.requests == {}
    # It keeps heart-beating (a peer does not stop): each message is a protocol error, the refusal is
    # repeated at most once a second.
    errors = {"kind": "refused"}
    await wait_until(lambda: sample(frontend.metrics, "openinfer:protocol_errors_total", errors) >= 3)
    await wait_until(lambda: len(stranger.refusals) == 2, timeout=3)
    assert sample(frontend.metrics, "openinfer:engine_restarts_total", {"engine": "0"}) == 0
    await stranger.stop()  # the stranger dies: nothing to take back, the first never left
    record = registry.current(0, first.incarnation)
    assert record is not None
    seq_at_stop = record.last_seq
    # Two more of the first's heartbeats taken after the stranger's connection closed: it still holds index 0.
    await wait_until(lambda: record.last_seq >= seq_at_stop + 2, timeout=3)
    assert frontend.client.num_engines_up == 1 and registry.current(0, first.incarnation) is record
    assert record.up and record.disconnected_at is None


async def test_restarted_engine_is_taken_back_at_once(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Engine 0's process dies (its connections close) and a new incarnation says hello at once, maybe read
    before the close: it is taken long before the 30 s timeout (a 2 s wait), and counted a restart."""
    frontend = await start_frontend(engine_timeout=30.0)
    peer = await start_peer(frontend)
    old = peer.incarnation
    await peer.restart()
    # A bounded wait far inside the 30 s timeout: only the closed connection can free the index this soon.
    await wait_until(lambda: frontend.client.registry.current(0, peer.incarnation) is not None, timeout=2)
    assert peer.refusals == []
    assert frontend.client.registry.is_retired(0, old) and not frontend.client.registry.is_refused(0, old)
    assert sample(frontend.metrics, "openinfer:engine_restarts_total", {"engine": "0"}) == 1
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    assert len([output async for output in stream]) == 3


async def test_silent_engine_yields_its_index_after_the_timeout(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """A holder that stops sending (a hung host, its connection still open): the newcomer waits, and is
    taken once the holder is silent past the timeout, not refused."""
    frontend = await start_frontend(engine_timeout=0.6)
    holder = await start_peer(frontend)
    holder.silent = True
    newcomer = await start_peer(frontend, wait=False)
    await wait_until(lambda: frontend.client.registry.current(0, newcomer.incarnation) is not None, timeout=3)
    assert frontend.client.registry.is_retired(0, holder.incarnation)  # taken from the holder, not beside it
    assert newcomer.refusals == [] and holder.refusals == []
    stream = await frontend.client.add_request(make_request("r1"), "tiny")
    assert len([output async for output in stream]) == 3
    assert "r1" in newcomer.requests


async def test_outputs_of_a_waiting_hello_are_not_merged(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """While its claim waits, a newcomer's heartbeats are dropped without a hello request or an error."""
    frontend = await start_frontend()
    first = await start_peer(frontend, PeerConfig(heartbeat_s=0.5))  # slow: the verdict takes a while
    stranger = await start_peer(frontend, PeerConfig(heartbeat_s=0.05), wait=False)
    # No verdict before the holder is heard from after the hello (0.5 s); the stranger's hello and three
    # heartbeats are sent meanwhile.
    await wait_until(lambda: stranger.num_sent >= 4, timeout=3)
    registry = frontend.client.registry
    assert registry.current(0, stranger.incarnation) is None and not registry.is_retired(
        0, stranger.incarnation
    )
    assert stranger.hello_requests == 0
    assert sample(frontend.metrics, "openinfer:protocol_errors_total", {"kind": "refused"}) == 0
    await wait_until(lambda: len(stranger.refusals) == 1, timeout=3)
    assert frontend.client.registry.current(0, first.incarnation) is not None
