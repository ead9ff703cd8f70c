"""benchmarks/request_path.py: the counting rules on known sequences, and one traced request end to end."""

from __future__ import annotations

import asyncio
import sys

from openinfer import protocol
from openinfer.benchmarks.request_path import PathTracer, ProcessPath, project_name, trace_request


def test_steps_and_revisits_follow_the_running_file() -> None:
    """a -> b -> a -> c -> a: four steps, two into a file already visited (a twice), three files."""
    path = ProcessPath()
    previous = None
    for name in ["a", "b", "a", "c", "a"]:
        path.enter(previous, name)
        previous = name
    assert (path.steps, path.revisits, len(path.entries)) == (4, 2, 3)
    assert path.edges[("b", "a")] == 1 and path.edges[("a", "b")] == 1


def test_only_project_files_are_named() -> None:
    """Files of openinfer's packages get a package-relative name; others (asyncio here) none."""
    assert project_name(protocol.__file__ or "") == "openinfer.protocol/__init__.py"
    assert project_name(asyncio.__file__ or "") is None


def test_a_traced_call_counts_the_files_it_crosses() -> None:
    """Encoding an engine output from this test crosses into protocol/ and back: counted as the frontend's."""
    tracer = PathTracer()
    sys.setprofile(tracer.profile)
    try:
        tracer.start()
        protocol.EngineOutputCodec().encode(
            protocol.EngineCoreOutputs(0, 1, 0, 0.0, [], protocol.LoadSnapshot(0, 1, 0, 0, None))
        )
    finally:
        sys.setprofile(None)
    entries = tracer.paths["frontend"].entries
    assert entries["openinfer.protocol/codec.py"] >= 1
    assert not tracer.paths["engine"].entries


def test_one_streamed_request_crosses_the_engine_step_and_the_frontend() -> None:
    """A streamed DFlash chat request runs through the engine's step (scheduler, worker, sampler, DFlash) and
    the frontend's route, each file counted in its own process."""
    tracer = asyncio.run(trace_request(max_tokens=4))
    engine, frontend = tracer.paths["engine"].entries, tracer.paths["frontend"].entries
    for name in ("core/engine_core.py", "core/scheduler.py", "worker/worker.py", "sample/sampler.py",
                 "spec_decode/dflash.py"):  # fmt: skip
        assert engine[f"openinfer.engine_core/{name}"] >= 1, name
    assert frontend["openinfer.frontend/openai/api_server.py"] >= 1
    assert not any(name.startswith("openinfer.engine_core/") for name in frontend)
