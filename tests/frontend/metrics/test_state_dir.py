"""--state-dir: totals and baselines saved together and atomically; a restarted frontend continues exactly."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from prometheus_client import generate_latest

from openinfer.frontend.metrics.frontend_metrics import MAX_FORGOTTEN, FrontendMetrics
from openinfer.frontend.metrics.state_dir import STATE_FILE, StateDir, StateError
from openinfer.frontend.metrics.totals import MetricTotals
from openinfer.protocol import SpecDecodeCounters
from tests.frontend.engine_peer import PeerConfig
from tests.frontend.frontends import FrontendFactory, PeerFactory
from tests.frontend.metrics.metrics_samples import counters, drafts, load, per_position, value
from tests.frontend.waits import wait_until


def test_totals_round_trip_to_the_same_exposition() -> None:
    """Counters and histograms restored from their state expose exactly the same text."""
    first = MetricTotals()
    requests = first.counter("requests", "Requests.", ("model",))
    latency = first.histogram("latency_seconds", "Latency.", ("model",), (0.1, 1.0))
    requests.inc(("a",), 3)
    requests.inc(("b",), 0)
    for seconds in (0.05, 0.1, 0.5, 7.0):  # 0.1 is in the le="0.1" bucket: upper bounds are inclusive
        latency.observe(("a",), seconds)
    state = msgspec.json.decode(msgspec.json.encode(first.state()), type=type(first.state()))

    second = MetricTotals()
    second.counter("requests", "Requests.", ("model",))
    second.histogram("latency_seconds", "Latency.", ("model",), (0.1, 1.0))
    second.restore(state)
    assert list(second.collect()) == list(first.collect())
    samples = {(s.name, tuple(s.labels.items())): s.value for m in second.collect() for s in m.samples}
    assert samples[("latency_seconds_bucket", (("model", "a"), ("le", "0.1")))] == 2
    assert samples[("latency_seconds_bucket", (("model", "a"), ("le", "+Inf")))] == 4
    assert samples[("latency_seconds_sum", (("model", "a"),))] == pytest.approx(7.65)
    with pytest.raises(ValueError, match="only go up"):
        requests.inc(("a",), -1)


def test_state_dir_saves_atomically_and_only_changes(tmp_path: Path) -> None:
    """A save writes the file by rename (no temp file left); an unchanged state is not written again."""
    state_dir = StateDir(tmp_path / "state")
    metrics = FrontendMetrics(state_dir)
    metrics.save()
    metrics.render()  # nothing changed since
    assert state_dir.num_saves == 1
    metrics.observe_first_token("m", 0, 7, 0.01)
    metrics.render()
    assert state_dir.num_saves == 2
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["frontend-state.json", "frontend.lock"]
    state_dir.close()


def test_state_dir_is_locked_and_checked(tmp_path: Path) -> None:
    """A second frontend on the same folder, a corrupt file and a foreign version are refused clearly."""
    first = StateDir(tmp_path)
    with pytest.raises(StateError, match="in use by another frontend"):
        StateDir(tmp_path)
    first.close()
    (tmp_path / STATE_FILE).write_bytes(b'{"version": 1, "tot')
    with pytest.raises(StateError, match="move it away"):
        StateDir(tmp_path).load()
    (tmp_path / STATE_FILE).write_bytes(
        b'{"version": 99, "totals": {}, "spec_baselines": {}, "incarnations": {}}'
    )
    with pytest.raises(StateError, match="version 99"):
        FrontendMetrics(StateDir(tmp_path))


def test_restarted_frontend_continues_every_series(tmp_path: Path) -> None:
    """After a restart: a known incarnation is diffed against its saved baseline, a new incarnation counts
    from zero (a restart), an engine never seen takes its snapshot as baseline; serving counters and
    histograms go on from their totals."""
    first_dir = StateDir(tmp_path)
    first = FrontendMetrics(first_dir)
    first.engine_joined(0, 111)
    first.engine_joined(1, 222)
    first.observe_load(0, 111, "m", load(counters(3, (3, 1))))  # first seen: the baseline
    first.observe_load(0, 111, "m", load(counters(3, (3, 1), (3, 3))))  # +1 draft
    first.observe_load(1, 222, "m", load(counters(3, (2, 0))))
    first.observe_load(1, 222, "m", load(counters(3, (2, 0), (1, 1), (1, 0))))  # +2 drafts
    first.observe_first_token("m", 0, 5, 0.02)
    first.observe_finish("m", 0, "stop", 0.4)
    first.render()  # a scrape: saved first
    first.observe_load(0, 111, "m", load(counters(3, (3, 1), (3, 3), (3, 2))))  # +1, never saved
    first_dir.close()  # as a SIGKILL would (the lock goes with the process)

    second = FrontendMetrics(StateDir(tmp_path))
    assert drafts(second, "0") == 1 and drafts(second, "1") == 2
    second.engine_joined(0, 111)  # the same incarnation: no restart
    second.engine_joined(1, 333)  # a new one
    second.engine_joined(2, 444)  # never seen
    second.observe_load(0, 111, "m", load(counters(3, (3, 1), (3, 3), (3, 2))))
    second.observe_load(1, 333, "m", load(counters(3, (1, 1))))
    second.observe_load(2, 444, "m", load(counters(3, (1, 0), (1, 0))))
    assert drafts(second, "0") == 2  # the unsaved draft is counted once, from the saved baseline
    assert drafts(second, "1") == 3  # 2 + everything the new incarnation holds
    assert drafts(second, "2") == 0  # its snapshot is the baseline
    assert value(second, "openinfer:engine_restarts_total", engine="0") == 0
    assert value(second, "openinfer:engine_restarts_total", engine="1") == 1
    assert value(second, "vllm:prompt_tokens_total", model_name="m", engine="0") == 5
    assert (
        value(second, "vllm:request_success_total", model_name="m", engine="0", finished_reason="stop") == 1
    )
    assert value(second, "vllm:e2e_request_latency_seconds_count", model_name="m") == 1
    assert b"vllm:time_to_first_token_seconds_bucket" in generate_latest(second.registry)


def test_verify_length_counters_continue_through_a_restart(tmp_path: Path) -> None:
    """The verified and reached per-position counts, the unverified count and the confidence sums are saved
    with their baselines: after a SIGKILL the same incarnation goes on from the saved baseline, nothing lost
    (the unsaved rounds) or counted twice."""
    spec = SpecDecodeCounters.zero(3)
    spec.observe_draft(3, 1, confidence=[0.5, 0.5, 0.5])
    first_dir = StateDir(tmp_path)
    first = FrontendMetrics(first_dir)
    first.engine_joined(0, 111)
    first.observe_load(0, 111, "m", load(spec.copy()))  # first seen: the baseline
    spec.observe_draft(2, 1, num_unverified=1, confidence=[0.75, 0.25])  # P=3, V=2
    spec.observe_unverified(2)  # P=2, V=0: no draft
    first.observe_load(0, 111, "m", load(spec.copy()))
    first.render()  # saved
    spec.observe_draft(1, 0, num_unverified=2, confidence=[0.125])  # P=3, V=1: published, never saved
    first.observe_load(0, 111, "m", load(spec.copy()))
    first_dir.close()

    second = FrontendMetrics(StateDir(tmp_path))
    second.engine_joined(0, 111)
    second.observe_load(0, 111, "m", load(spec.copy()))
    verified = per_position(second, "openinfer:spec_decode_num_draft_tokens_per_pos_total", 3)
    assert verified == [2, 1, 0]  # the drafts of 2 and 1 tokens since the baseline
    unverified = value(
        second, "openinfer:spec_decode_num_unverified_draft_tokens_total", model_name="m", engine="0"
    )
    assert unverified == 5  # 1 + 2 + 2
    assert drafts(second, "0") == 2
    reached = per_position(second, "openinfer:spec_decode_num_reached_per_pos_total", 3)
    assert reached == [2, 1, 0]  # (2, 1): tokens 0 and 1; (1, 0): token 0
    micros = per_position(second, "openinfer:spec_decode_confidence_micros_per_pos_total", 3)
    assert micros == [875_000, 250_000, 0]  # .75 + .125, .25; the baseline's .5s never


async def test_frontend_restart_over_real_sockets(
    tmp_path: Path, start_frontend: FrontendFactory, start_peer: PeerFactory
) -> None:
    """A new frontend on the same address and state folder: the engine reconnects by itself, says hello
    when asked, and its counters continue from the saved baseline."""
    first = await start_frontend(state_dir=StateDir(tmp_path))
    peer = await start_peer(first, PeerConfig(spec=counters(2, (2, 1))))
    assert peer.spec is not None
    peer.spec.observe_draft(2, 2)
    await peer.send_snapshot()
    get = first.metrics.registry.get_sample_value
    await wait_until(
        lambda: get("vllm:spec_decode_num_drafts_total", {"model_name": "tiny", "engine": "0"}) == 1
    )
    first.metrics.render()
    await first.runner.cleanup()
    await first.client.close()
    first.metrics._state_dir.close()  # type: ignore[union-attr]
    peer.spec.observe_draft(2, 0)  # while no frontend listens

    second = await start_frontend(state_dir=StateDir(tmp_path), engine_address=first.engine_address)
    await wait_until(lambda: second.client.num_engines_up == 1)
    get = second.metrics.registry.get_sample_value
    assert get("vllm:spec_decode_num_drafts_total", {"model_name": "tiny", "engine": "0"}) == 2
    hist = [
        get(
            "openinfer:spec_decode_accepted_length_total",
            {"model_name": "tiny", "engine": "0", "accepted": a},
        )
        for a in "012"
    ]
    assert hist == [1, 0, 1]  # the hello's (2,1) was the first baseline; (2,2) and (2,0) came after
    assert peer.hello_requests >= 1


def test_state_files_are_private(tmp_path: Path) -> None:
    """The folder made for the state is 0700, the state and lock files 0600; a state file an older release
    left readable to all is tightened when it is loaded."""
    path = tmp_path / "state"
    state_dir = StateDir(path)
    FrontendMetrics(state_dir).save()
    state_dir.close()
    mode = {name: (path / name).stat().st_mode & 0o777 for name in (STATE_FILE, "frontend.lock")}
    assert (path.stat().st_mode & 0o777, mode) == (0o700, {STATE_FILE: 0o600, "frontend.lock": 0o600})
    (path / STATE_FILE).chmod(0o644)
    state_dir = StateDir(path)
    assert state_dir.load() is not None and (path / STATE_FILE).stat().st_mode & 0o777 == 0o600
    state_dir.close()


def test_links_in_place_of_state_files_are_refused(tmp_path: Path) -> None:
    """A symbolic link planted in place of the lock file or the state file (as in a folder others can write)
    is refused with an error saying so, and the file it points at is neither read nor changed; one in place
    of the temporary file is removed, never written through, and the state saved is 0600."""
    target = tmp_path / "someone-elses-file"
    target.write_bytes(b"kept")
    target.chmod(0o644)
    path = tmp_path / "state"
    path.mkdir()
    (path / "frontend.lock").symlink_to(target)
    with pytest.raises(StateError, match="frontend.lock is a symbolic link, .*remove the link"):
        StateDir(path)
    (path / "frontend.lock").unlink()
    (path / STATE_FILE).symlink_to(target)
    state_dir = StateDir(path)
    with pytest.raises(StateError, match=f"{STATE_FILE} is a symbolic link, .*remove the link"):
        state_dir.load()
    (path / STATE_FILE).unlink()
    (path / f".{STATE_FILE}.tmp").symlink_to(target)
    FrontendMetrics(state_dir).save()
    state_dir.close()
    assert (target.read_bytes(), target.stat().st_mode & 0o777) == (b"kept", 0o644)
    assert sorted(p.name for p in path.iterdir()) == [STATE_FILE, "frontend.lock"]
    assert (path / STATE_FILE).stat().st_mode & 0o777 == 0o600


def test_a_join_saves_only_a_baseline_not_yet_saved(tmp_path: Path) -> None:
    """The first snapshot of an index never seen saves the state at once (a frontend killed before its next
    periodic save must not lose the baseline); later snapshots, a restart of the index and the same
    incarnation joining again save nothing (the saved baseline covers them)."""
    state_dir = StateDir(tmp_path)
    metrics = FrontendMetrics(state_dir)
    metrics.engine_joined(0, 111)
    metrics.observe_load(0, 111, "m", load(counters(3)))
    assert state_dir.num_saves == 1
    metrics.observe_load(0, 111, "m", load(counters(3, (3, 1))))
    metrics.engine_joined(0, 111)  # asked for its hello again
    metrics.observe_load(0, 111, "m", load(counters(3, (3, 1))))
    metrics.engine_joined(0, 222)  # restarted
    metrics.observe_load(0, 222, "m", load(counters(3)))
    assert state_dir.num_saves == 1
    metrics.engine_joined(1, 333)
    metrics.observe_load(1, 333, "m", load(None))  # a new index, even without a drafter
    assert state_dir.num_saves == 2
    state_dir.close()


def test_a_forgotten_engine_continues_through_a_frontend_restart(tmp_path: Path) -> None:
    """An index forgotten after its hello (its series dropped) is saved as forgotten with its baseline: a
    restarted frontend counts every draft the same incarnation made since that hello, and remakes the
    series when it comes back."""
    first_dir = StateDir(tmp_path)
    first = FrontendMetrics(first_dir)
    first.engine_joined(0, 111)
    first.observe_load(0, 111, "m", load(counters(3)))
    first.forget_load(0, "m")  # (as the engine client does when the record goes down)
    assert first.forget_engine(0)
    assert b'engine="0"' not in first.render()  # (rendering saves)
    first_dir.close()

    second = FrontendMetrics(StateDir(tmp_path))
    assert second.state().forgotten == [0]
    second.engine_joined(0, 111)
    second.observe_load(0, 111, "m", load(counters(3, (3, 1), (3, 3))))
    assert drafts(second, "0") == 2
    assert value(second, "openinfer:engine_restarts_total", engine="0") == 0
    assert second.state().forgotten == []


def test_forgotten_indices_keep_their_counting_state_up_to_a_bound() -> None:
    """Past MAX_FORGOTTEN forgotten indices, the oldest one's baselines and incarnation go too (strangers can
    make any number): its engine coming back is then a first sight."""
    metrics = FrontendMetrics()
    for index in range(MAX_FORGOTTEN + 2):
        metrics.engine_joined(index, index)
        metrics.observe_load(index, index, "m", load(counters(3)))
        assert metrics.forget_engine(index)
    state = metrics.state()
    kept = list(range(2, MAX_FORGOTTEN + 2))
    assert state.forgotten == kept and list(state.spec_baselines) == kept and list(state.incarnations) == kept
    assert list(state.prefix_cache_baselines) == kept
    metrics.engine_joined(0, 0)
    metrics.observe_load(0, 0, "m", load(counters(3, (3, 1))))  # a first sight again: the baseline
    assert drafts(metrics, "0") == 0
