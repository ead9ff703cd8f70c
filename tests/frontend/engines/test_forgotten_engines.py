"""A record never heard from after its hello is forgotten when it goes down, but its counts are not: a real
engine whose first step outlasts the engine timeout (a long prefill, a JIT compile; heartbeats come between
steps) comes back with drafts made since its hello, and every one is counted. Real sockets throughout."""

from __future__ import annotations

from openinfer.protocol import SpecDecodeCounters
from tests.frontend.engine_peer import EnginePeer, PeerConfig
from tests.frontend.frontends import Frontend, FrontendFactory, PeerFactory
from tests.frontend.waits import wait_until

K = 3


def sample(frontend: Frontend, name: str, **labels: str) -> float | None:
    return frontend.metrics.registry.get_sample_value(name, labels)


def drafts(frontend: Frontend) -> float | None:
    return sample(frontend, "vllm:spec_decode_num_drafts_total", model_name="tiny", engine="0")


async def forgotten_after_hello(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> tuple[Frontend, EnginePeer]:
    """A frontend and an engine that said hello (counters at zero) and then nothing, until its record and
    series are gone."""
    frontend = await start_frontend(engine_timeout=0.5)
    peer = await start_peer(frontend, PeerConfig(spec=SpecDecodeCounters.zero(K)), wait=False)
    peer.silent = True  # before its first heartbeat (0.1 s away): only the hello was sent
    await wait_until(lambda: frontend.client.registry.get(0) is not None)
    await wait_until(lambda: frontend.client.registry.get(0) is None)
    assert drafts(frontend) is None and sample(frontend, "openinfer:engine_up", engine="0") is None
    return frontend, peer


async def test_an_engine_forgotten_during_its_first_step_has_every_draft_counted(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Silent past the timeout right after its hello (forgotten), then outputs whose counters hold 3 drafts:
    asked for its hello, it joins again and /metrics counts all 3 (and per position), no restart."""
    frontend, peer = await forgotten_after_hello(start_frontend, start_peer)
    assert peer.spec is not None
    for num_accepted in (3, 1, 0):  # the drafts of its first, long step
        peer.spec.observe_draft(K, num_accepted)
    peer.silent = False
    await peer.send_snapshot()

    await wait_until(lambda: drafts(frontend) == 3)
    assert peer.hello_requests == 1
    per_pos = [
        sample(frontend, "vllm:spec_decode_num_accepted_tokens_per_pos_total", model_name="tiny",
               engine="0", position=str(i))
        for i in range(K)
    ]  # fmt: skip
    assert per_pos == [2, 1, 1]  # accepted 3, 1, 0: positions 0..2, 0, none
    assert sample(frontend, "openinfer:engine_restarts_total", engine="0") == 0
    assert sample(frontend, "openinfer:engine_up", engine="0") == 1


async def test_an_engine_forgotten_then_restarted_is_counted_as_a_restart(
    start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """Forgotten after its hello, the engine dies and a new incarnation of its index joins: a restart, and
    the new incarnation's drafts count from zero."""
    frontend, peer = await forgotten_after_hello(start_frontend, start_peer)
    peer.silent, peer.spec = False, SpecDecodeCounters.zero(K)  # (a peer keeps both over a restart)
    await peer.restart()
    await wait_until(lambda: frontend.client.num_engines_up == 1)
    assert sample(frontend, "openinfer:engine_restarts_total", engine="0") == 1
    peer.spec.observe_draft(K, 2)
    await peer.send_snapshot()
    await wait_until(lambda: drafts(frontend) == 1)
