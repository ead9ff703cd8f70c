"""deploy/Dockerfile (the CUDA engine image) as far as it can be checked without a GPU or its base image: its
pins agree with each other and with the CPU image, and the Python packages it installs resolve for its
Python (Ubuntu 24.04's 3.12) on x86_64, and docker-compose.yml's GPU profiles validate and build every GPU
engine from it (test_compose.py checks their wiring). Building it needs the nvidia/cuda images."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.compose_files import active, compose_config
from tests.deploy.images import reachable
from tests.deploy.stack import DEPLOY

ROOT = DEPLOY.parent
UBUNTU_PYTHON = "3.12"  # python3 of ubuntu24.04, the UBUNTU the Dockerfile names
# glibc 2.5 .. 2.39 (Ubuntu 24.04): every manylinux wheel that installs there (pip takes the tags one by one).
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)] + [
    f"manylinux{legacy}_x86_64" for legacy in ("2014", "2010", "1")
]


def dockerfile_args(path: Path) -> dict[str, list[str]]:
    """Every ``ARG NAME=default`` of a Dockerfile: name -> the defaults, one per stage that declares it."""
    args: dict[str, list[str]] = {}
    for name, value in re.findall(r"^ARG (\w+)=(\S+)", path.read_text(), re.M):
        args.setdefault(name, []).append(value.strip('"'))
    return args


def test_pins_agree() -> None:
    """Both stages pin the same torch and flash-attn; torch is the CPU image's and the README's; the wheel
    index matches the CUDA version; flash-attn's pin satisfies the `gpu` extra."""
    cuda = dockerfile_args(DEPLOY / "Dockerfile")
    cpu = dockerfile_args(DEPLOY / "Dockerfile.cpu")
    (torch_version,) = set(cuda["TORCH_VERSION"])
    assert cuda["TORCH_VERSION"] == [torch_version] * 2 and cpu["TORCH_VERSION"] == [torch_version]
    assert f"torch=={torch_version}" in (ROOT / "README.md").read_text()
    ((cuda_version,), (torch_cuda,)) = set(cuda["CUDA_VERSION"]), set(cuda["TORCH_CUDA"])
    assert torch_cuda == "cu" + "".join(cuda_version.split(".")[:2])  # 12.8.1 -> cu128
    assert cuda["UBUNTU"] == ["ubuntu24.04"]  # UBUNTU_PYTHON's
    (flash_attn,) = set(cuda["FLASH_ATTN_VERSION"])
    (gpu_extra,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "gpu"
    ]
    assert Requirement(gpu_extra).specifier.contains(flash_attn)


def test_python_requirements_resolve() -> None:
    """pip resolves what the image installs, torch at its pin with openinfer's dependencies, from wheels for
    CPython 3.12 on x86_64 Linux (a dry run: only metadata is fetched), and flash-attn's pinned source
    release is on PyPI. torch comes from PyTorch's TORCH_CUDA index as in the image where that index is
    reachable, else from PyPI (its torch of the same version is a CUDA build too)."""
    if not reachable("https://pypi.org/simple/pip/"):
        pytest.skip("PyPI is unreachable: the CUDA image's requirements cannot be resolved here")
    cuda = dockerfile_args(DEPLOY / "Dockerfile")
    torch_version, torch_cuda = cuda["TORCH_VERSION"][0], cuda["TORCH_CUDA"][0]
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    index = f"https://download.pytorch.org/whl/{torch_cuda}"
    indexes = ["--extra-index-url", index] if reachable(f"{index}/torch/") else []
    if not indexes:
        print(f"\n{index} is unreachable: torch {torch_version} resolves from PyPI instead")
    report = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"),
            *("--report", "-", "--target", "unused", "--only-binary=:all:"),
            *("--python-version", UBUNTU_PYTHON, *(f"--platform={p}" for p in PLATFORMS)),
            *indexes,
            f"torch=={torch_version}",
            *dependencies,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.returncode == 0, report.stderr[-4000:]
    installs = json.loads(report.stdout)["install"]
    resolved: dict[str, str] = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in installs
    }
    assert resolved["torch"].split("+")[0] == torch_version
    for dependency in map(Requirement, dependencies):
        assert dependency.specifier.contains(
            resolved[canonicalize_name(dependency.name)], prereleases=True
        ), dependency

    flash_attn = cuda["FLASH_ATTN_VERSION"][0]
    with urllib.request.urlopen("https://pypi.org/simple/flash-attn/", timeout=30) as r:
        assert f"flash_attn-{flash_attn}.tar.gz" in r.read().decode()


def test_compose_gpu_profiles_build_this_image() -> None:
    """`docker-compose config` validates the gpu-8 profile, and each of its engines builds deploy/Dockerfile
    from the repository root as the one engine image, reserving an NVIDIA GPU."""
    services = active(compose_config("--profile", "gpu-8"), {"gpu-8"})
    engines = {name: service for name, service in services.items() if name.startswith("engine-")}
    assert sorted(engines) == [f"engine-{i}" for i in range(8)]
    for name, engine in engines.items():
        assert engine["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert Path(engine["build"]["context"]).resolve() == ROOT, name
        assert engine["image"] == "openinfer-engine:latest", name
        (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia", name
