"""deploy/'s frontend and CPU engine images, built from the project's own files and run as containers.

buildah builds deploy/Dockerfile.frontend and deploy/Dockerfile.cpu unchanged but for their BASE_IMAGE, a
Debian bookworm root bootstrapped here (tests/deploy/images.py: no image registry is reachable), and podman
runs the frontend, two CPU engines (the built-in model with its DFlash drafter, K=7 and K=4, writing spec
logs) and Prometheus (Debian's package in an image on the same base, with deploy/prometheus/'s config and
rules at 1 s intervals) on the host's network. After a load, /metrics equals the spec logs and the recorded
acceptance rate, mean acceptance length, per-position curve and accepted-length distribution equal the
logs' to 1e-12 relative, as in test_prometheus_live.py (which says why). Images are cached by a hash of
their inputs under OPENINFER_IMAGE_CACHE (default ~/.cache/openinfer-images); the first run builds them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from openinfer.tools.spec_tally import total
from tests.deploy.built_images import TORCH_VERSION, Images, ready_images
from tests.deploy.containers import Containers, FrontendContainers, PrometheusContainer
from tests.deploy.images import Storage, reachable, require_image_tools
from tests.deploy.live_host import Host, run_load, wait_for_final_counters, wait_for_zero_scrape
from tests.deploy.recorded_checks import check_host_ratios, check_totals
from tests.deploy.stack import host_config, wait_until

pytestmark = pytest.mark.timeout(1200)  # a first run bootstraps the base and builds every image (4-6 min)

KS = (7, 4)  # K of each engine (the built-in drafter drafts up to 7)


@pytest.fixture(scope="module")
def images() -> Iterator[Images]:
    """The three images, built unless an image with the same inputs' hash exists; the storage unmounted at
    the end (so that the cache folder can be deleted)."""
    require_image_tools()
    if not reachable("https://pypi.org/simple/pip/"):
        pytest.skip("PyPI is unreachable: the images' `pip install` steps cannot run here")
    storage = Storage()
    try:
        yield ready_images(storage)
    finally:
        storage.unmount()


@pytest.fixture(scope="module")
def host(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """The containers, their zero scrape, a load, and the final counters scraped and evaluated."""
    work = tmp_path_factory.mktemp("images")
    containers = Containers(images.storage, work)
    try:
        frontend = FrontendContainers(containers, images.frontend, work / "spec-logs")
        for index, k in enumerate(KS):
            frontend.start_engine(images.cpu, index, k)
        wait_until(frontend.healthy, 180, "the frontend container with both engines", containers)
        # Prometheus only now: its first scrape sees every engine's counters at 0.
        prometheus = PrometheusContainer(containers, images.prometheus, work, env={"OPENINFER_HOST": "a"})
        prometheus.start(host_config(frontend, prometheus.target))
        wait_until(prometheus.ready, 120, "the Prometheus container ready", containers)
        live = Host("a", frontend, prometheus)
        wait_for_zero_scrape(live, containers)
        asyncio.run(run_load([(frontend, 8)]))
        wait_for_final_counters(live, containers)
        yield live
    finally:
        containers.stop()


def test_container_metrics_equal_spec_logs(host: Host) -> None:
    """The frontend container's /metrics equals the engine containers' spec logs (wait_for_final_counters
    waits for exactly that), and the Prometheus container's recorded ratios and totals equal the logs'."""
    check_host_ratios(host.prometheus, host.t_eval, host.logs, KS)
    check_totals(host.prometheus, host.t_eval, total(host.logs.values()), max(KS))
    assert all(tally.num_drafts for tally in host.logs.values())  # both engines drafted


def test_frontend_image_has_no_torch(images: Images) -> None:
    """The frontend image runs without torch, numpy or transformers installed."""
    probe = (
        "import importlib.util as u; print([m for m in ('torch', 'numpy', 'transformers') if u.find_spec(m)])"
    )
    out = images.storage.podman("run", "--rm", "--entrypoint", "python", images.frontend, "-c", probe)
    assert out.strip().splitlines()[-1] == "[]"


def test_cpu_image_has_the_cpu_torch(images: Images) -> None:
    """The CPU engine image holds torch's CPU build at the pinned version and no triton, structured outputs
    (xgrammar, which lists triton as a requirement) import without it, and inductor compiles there (its C++
    compiler is in the image: -O3 engines compile, not fall back to eager), into the user's cache folder."""
    probe = (
        "import importlib.util as u, torch, xgrammar, openinfer.engine_core.sample.structured_output; "
        "from openinfer.engine_core.worker.compiled_forward import compiler_missing; "
        "from openinfer.engine_core.compilation_config import CompilationConfig; "
        "d = CompilationConfig().artifact_dir(); d.mkdir(parents=True); "
        "f = torch.compile(lambda x: torch.sin(x) * 2, backend='inductor'); "
        "print(torch.__version__, torch.version.cuda, u.find_spec('triton') is not None, "
        "compiler_missing(torch.device('cpu')), f(torch.zeros(3)).tolist(), d.is_dir())"
    )
    out = images.storage.podman("run", "--rm", "--entrypoint", "python", images.cpu, "-c", probe)
    assert out.strip().splitlines()[-1] == f"{TORCH_VERSION}+cpu None False None [0.0, 0.0, 0.0] True"
