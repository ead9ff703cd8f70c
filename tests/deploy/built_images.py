"""deploy/'s images as the container tests use them: each built once on the bootstrapped Debian base and cached
by a hash of its inputs (tests/deploy/images.py), its pip installs from the index the Dockerfile names or, where
that is unreachable or the build must not depend on it, from a loopback index of the same wheels."""

from __future__ import annotations

import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.images import (
    CACHE,
    Storage,
    WheelIndex,
    base_image,
    build,
    cpu_torch_wheels,
    image_tag,
    reachable,
    run,
)
from tests.deploy.stack import DEPLOY

TORCH_VERSION = re.search(r"ARG TORCH_VERSION=(\S+)", (DEPLOY / "Dockerfile.cpu").read_text()).group(1)  # type: ignore[union-attr]
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ROUTER_VERSION = re.search(
    r"ARG VLLM_ROUTER_VERSION=(\S+)", (DEPLOY / "Dockerfile.router").read_text()
).group(1)  # type: ignore[union-attr]
# glibc up to bookworm's 2.36 (pip takes platform tags one by one)
PLATFORMS = [f"--platform=manylinux_2_{minor}_x86_64" for minor in range(17, 37)] + [
    f"--platform=manylinux{legacy}_x86_64" for legacy in ("2014", "2010", "1")
]


@dataclass
class Images:
    storage: Storage
    frontend: str
    cpu: str
    prometheus: str


def ready_images(storage: Storage) -> Images:
    """The frontend, CPU engine and Prometheus images (test_images.py's), built unless cached."""
    started = time.monotonic()
    base = base_image(storage)
    frontend = image_tag("localhost/openinfer-frontend", DEPLOY / "Dockerfile.frontend", base, {})
    if not storage.has_image(frontend):
        build(storage, frontend, DEPLOY / "Dockerfile.frontend", base, {})
    cpu = cpu_image(storage, base)
    dockerfile = Path(__file__).with_name("Dockerfile.prometheus")
    prometheus = image_tag("localhost/openinfer-prometheus", dockerfile, base, {})
    if not storage.has_image(prometheus):
        with tempfile.TemporaryDirectory() as empty:
            build(storage, prometheus, dockerfile, base, {}, context=Path(empty))
    print(
        f"\nimages ready in {time.monotonic() - started:.0f} s (cache: {CACHE}): {frontend} {cpu} {prometheus}"
    )
    return Images(storage, frontend, cpu, prometheus)


def cpu_image(storage: Storage, base: str) -> str:
    """deploy/Dockerfile.cpu's image: torch from PyTorch's CPU index, or where that is unreachable from a
    loopback index of the same wheels as this machine's pip finds them."""
    args = {"TORCH_VERSION": TORCH_VERSION}
    cpu = image_tag("localhost/openinfer-cpu", DEPLOY / "Dockerfile.cpu", base, args)
    if not storage.has_image(cpu):
        if reachable(f"{PYTORCH_CPU_INDEX}/torch/"):
            build(storage, cpu, DEPLOY / "Dockerfile.cpu", base, args)
        else:
            with WheelIndex(cpu_torch_wheels(TORCH_VERSION, storage.cache)) as index:
                build(storage, cpu, DEPLOY / "Dockerfile.cpu", base, {**args, "TORCH_INDEX_URL": index.url})
    return cpu


def router_image(storage: Storage, base: str) -> str:
    """deploy/Dockerfile.router's image, vllm-router and its dependencies installed from a loopback index of
    the wheels this machine's pip downloads for CPython 3.11 on x86_64 (the base's Python)."""
    args = {"VLLM_ROUTER_VERSION": ROUTER_VERSION}
    router = image_tag("localhost/openinfer-router", DEPLOY / "Dockerfile.router", base, args)
    if not storage.has_image(router):
        with WheelIndex(router_wheels(ROUTER_VERSION, storage.cache)) as index:
            build(
                storage, router, DEPLOY / "Dockerfile.router", base, {**args, "ROUTER_INDEX_URL": index.url}
            )
    return router


def router_wheels(version: str, into: Path) -> Path:
    """A folder with vllm-router==``version``'s wheel and its dependencies' for CPython 3.11, x86_64 Linux."""
    wheels = into / f"vllm-router-{version}-cp311"
    done = wheels / ".complete"
    if not done.exists():
        target = ["--python-version", "3.11", *PLATFORMS, "--only-binary=:all:", f"vllm-router=={version}"]
        log = into / "logs" / "router-download.log"
        run([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), *target], 600, log=log)
        done.touch()
    return wheels
