"""deploy/'s images built with buildah and run with podman, with no Docker engine and no image registry.

The base image is a Debian root bootstrapped by mmdebstrap from Debian's packages: bookworm's Python 3.11 (the
Python of python:3.11-slim, the Dockerfiles' default base) in a venv on PATH, so that `pip` installs as it
does in python:3.11-slim (OPENINFER_DEBIAN_MIRROR: another mirror than deb.debian.org). It is imported into
a container storage of our own (overlay, or vfs where overlay cannot mount) under the cache directory
(OPENINFER_IMAGE_CACHE, default ~/.cache/openinfer-images), and the Dockerfiles take it as BASE_IMAGE. Each
image is tagged with a hash of everything that goes into it, so an unchanged image is never built again.
Every command here runs in its own process group, killed past its time limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("OPENINFER_IMAGE_CACHE", Path.home() / ".cache" / "openinfer-images"))
TOOLS = ("podman", "buildah", "runc", "mmdebstrap")
INSTALL = "apt-get install -y --no-install-recommends podman buildah runc mmdebstrap"

# Debian 12: Python 3.11, as python:3.11-slim and a cp311 torch wheel need.
SUITE = "bookworm"
MIRROR = os.environ.get("OPENINFER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("python3", "python3-venv", "ca-certificates")
VENV = "/opt/venv"
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The host's CA bundle (Debian's path), so that pip in the builds trusts what the host's tools trust: PyPI
# behind a TLS-inspecting proxy too.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# podman's default ulimits (nofile=1048576) can exceed what a container may set inside a sandbox.
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"


def require_image_tools() -> None:
    """Skip the calling test, saying why, unless buildah, podman and mmdebstrap can work here."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: `{INSTALL}` (Debian's packages; .ci/run installs them)"
        )
    if os.geteuid() != 0:
        pytest.skip("the image tests run as root (mmdebstrap --mode=root, podman with runc and vfs storage)")


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None, log: Path | None = None) -> str:
    """Run ``argv`` in a new process group, which is killed past ``timeout`` seconds; its output, or an error
    with the output's tail if it fails. With ``log`` the output also goes to that file."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    ) as process:
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            raise TimeoutError(f"{argv[:3]}...: not done after {timeout:.0f} s\n{out[-4000:]}") from None
        except BaseException:  # pytest-timeout's or Ctrl-C's exception: the command must not outlive it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
    if log is not None:
        log.write_text(out)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... exited with {process.returncode}:\n{out[-4000:]}")
    return out


def digest(*parts: bytes | str) -> str:
    """A short hash of ``parts``, each length-prefixed (no two lists of parts hash alike)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:16]


class Storage:
    """buildah and podman on a container storage of our own, with our containers.conf: the overlay driver
    where the kernel lets containers/storage mount it (containers start in a second), else vfs (a full copy
    of the image per container and per build). OPENINFER_IMAGE_STORAGE_DRIVER chooses one."""

    def __init__(self, cache: Path = CACHE) -> None:
        self.cache = cache
        (cache / "logs").mkdir(parents=True, exist_ok=True)
        conf = cache / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        chosen = os.environ.get("OPENINFER_IMAGE_STORAGE_DRIVER", "")
        errors = []
        for driver in [chosen] if chosen else ["overlay", "vfs"]:
            self.driver = driver
            self.flags = [
                "--root",
                str(cache / f"storage-{driver}"),
                "--runroot",
                str(cache / f"run-{driver}"),
            ]
            self.flags += ["--storage-driver", driver]
            try:  # containers/storage test-mounts an overlay when it sets the driver up
                self.podman("info", "--format", "{{.Store.GraphDriverName}}", timeout=60)
                break
            except (RuntimeError, TimeoutError) as error:
                errors.append(f"{driver}: {error}")
        else:
            raise RuntimeError("podman works with no storage driver here:\n" + "\n".join(errors))

    def unmount(self) -> None:
        """Undo the mount the overlay driver leaves on its own folder (``storage-overlay/overlay``), else the
        cache cannot be deleted; the next Storage mounts it again. Nothing to do for vfs, or when unmounted."""
        folder = self.cache / "storage-overlay" / "overlay"
        if self.driver == "overlay" and folder.exists():  # a bind mount on itself: ismount cannot tell
            subprocess.run(["umount", str(folder)], capture_output=True, timeout=60, check=False)

    def podman(self, *args: str, timeout: float = 120) -> str:
        runtime = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]
        return run(["podman", *self.flags, *runtime, *args], timeout, self.env)

    def buildah(self, *args: str, timeout: float, log: Path | None = None) -> str:
        return run(["buildah", *self.flags, *args], timeout, self.env, log)

    def has_image(self, ref: str) -> bool:
        try:
            self.podman("image", "exists", ref, timeout=60)
            return True
        except RuntimeError:
            return False

    def keep_only(self, ref: str) -> None:
        """Remove the other tags of ``ref``'s repository (older builds), so that the cache stays bounded; a
        tag still in use elsewhere stays."""
        repository = ref.rsplit(":", 1)[0]
        tags = self.podman("images", "--format", "{{.Repository}}:{{.Tag}}", repository).split()
        for tag in tags:
            if tag != ref:
                try:
                    self.podman("rmi", tag, timeout=120)
                except RuntimeError:
                    pass


def base_image(storage: Storage) -> str:
    """localhost/openinfer-base:HASH, bootstrapped (or its cached tarball imported) if not there yet."""
    options = [
        "--variant=minbase",
        "--mode=root",
        f"--include={','.join(PACKAGES)}",
        # documentation and translations: nothing in the images reads them
        *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")),
        f"--customize-hook=upload {CA_BUNDLE} {CA_BUNDLE}",
        f'--customize-hook=chroot "$1" python3 -m venv {VENV}',
    ]
    key = digest(SUITE, MIRROR, *options, PATH, CA_BUNDLE.read_bytes())
    tag = f"localhost/openinfer-base:{key}"
    if storage.has_image(tag):
        return tag
    tarball = storage.cache / f"base-{key}.tar"
    if not tarball.exists():
        if not reachable(f"{MIRROR}/dists/{SUITE}/Release"):
            pytest.skip(f"the Debian mirror {MIRROR} is unreachable (OPENINFER_DEBIAN_MIRROR names another)")
        for old in storage.cache.glob("base-*.tar"):
            old.unlink()
        partial = tarball.with_name(f"partial-{tarball.name}")  # mmdebstrap writes a tarball for *.tar
        run(
            ["mmdebstrap", *options, SUITE, str(partial), MIRROR],
            900,
            log=storage.cache / "logs" / "base.log",
        )
        partial.rename(tarball)
    storage.podman("import", "--change", f"ENV PATH={PATH}", str(tarball), tag, timeout=600)
    storage.keep_only(tag)
    return tag


def context_files(ignore_file: Path) -> list[Path]:
    """The files a build context filtered by ``ignore_file`` holds. deploy/'s ignore files all have one form:
    `**` (nothing), then `!path` lines (what goes in), then `**/name` lines (left out at any depth)."""
    lines = [line for line in ignore_file.read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "**", lines
    included = [line[1:] for line in lines[1:] if line.startswith("!")]
    left_out = {line[3:] for line in lines[1:] if line.startswith("**/")}
    assert len(included) + len(left_out) == len(lines) - 1, f"{ignore_file}: a form this hash does not know"
    files = []
    for name in included:
        path = ROOT / name
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if file.is_file() and not left_out & set(file.relative_to(ROOT).parts):
                files.append(file)
    return files


def image_tag(repository: str, dockerfile: Path, base: str, args: dict[str, str]) -> str:
    """REPOSITORY:HASH of the Dockerfile, its ignore file and context, the base image and build args."""
    ignore_file = dockerfile.with_name(dockerfile.name + ".dockerignore")
    parts: list[bytes | str] = [dockerfile.read_bytes(), base, json.dumps(args, sort_keys=True)]
    if ignore_file.exists():
        parts.append(ignore_file.read_bytes())
        for file in context_files(ignore_file):
            parts += [str(file.relative_to(ROOT)), file.read_bytes()]
    return f"{repository}:{digest(*parts)}"


def build(
    storage: Storage, tag: str, dockerfile: Path, base: str, args: dict[str, str], context: Path = ROOT
) -> None:
    """`buildah bud` ``dockerfile`` as ``tag`` on ``base``, then drop the repository's older tags. RUN steps
    share the host's network (pip reaches PyPI, and a wheel mirror on loopback)."""
    ignore_file = dockerfile.with_name(dockerfile.name + ".dockerignore")
    flags = ["--isolation", "chroot", "--network", "host", "-f", str(dockerfile), "-t", tag]
    if ignore_file.exists():
        flags += ["--ignorefile", str(ignore_file)]
    for name, value in {"BASE_IMAGE": base, **args}.items():
        flags += ["--build-arg", f"{name}={value}"]
    log = storage.cache / "logs" / f"{tag.rsplit('/', 1)[1].split(':')[0]}.log"
    before = set(storage.buildah("containers", "--quiet", timeout=60).split())
    try:
        storage.buildah("bud", *flags, str(context), timeout=900, log=log)
    except BaseException:
        # a failed or interrupted build leaves its working container behind: remove the ones it made, by id
        for container in set(storage.buildah("containers", "--quiet", timeout=60).split()) - before:
            storage.buildah("rm", container, timeout=120)
        raise
    storage.keep_only(tag)


def cpu_torch_wheels(version: str, into: Path) -> Path:
    """A folder with torch==``version``'s CPU wheel for CPython 3.11 on x86_64 and its dependencies, as this
    machine's pip finds them (its configuration may offer the CPU wheel; PyPI's own torch is the CUDA build).
    Skips the test if what pip would take is not the CPU build, before downloading anything."""
    wheels = into / f"torch-{version}-cp311"
    if any(wheels.glob(f"torch-{version}+cpu-*.whl")):
        return wheels
    # glibc up to bookworm's 2.36 (pip takes platform tags one by one)
    platforms = [f"--platform=manylinux_2_{minor}_x86_64" for minor in range(17, 37)]
    platforms += [f"--platform=manylinux{legacy}_x86_64" for legacy in ("2014", "2010", "1")]
    pip = [sys.executable, "-m", "pip"]
    target = ["-q", "--python-version", "3.11", *platforms, "--only-binary=:all:", f"torch=={version}"]
    report = into / "torch-report.json"
    dry_run = ["--dry-run", "--ignore-installed", "--no-deps", "--target", str(into / "unused")]
    run([*pip, "install", *dry_run, "--report", str(report), *target], 300)
    (choice,) = json.loads(report.read_text())["install"]
    if not choice["metadata"]["version"].endswith("+cpu"):
        pytest.skip(
            f"PyTorch's CPU index is unreachable and this machine's pip would take torch "
            f"{choice['metadata']['version']} ({choice['download_info']['url']}), not the CPU build: the CPU "
            "engine image cannot be built here"
        )
    run([*pip, "download", "-d", str(wheels), *target], 900, log=into / "logs" / "torch-download.log")
    return wheels


def reachable(url: str) -> bool:
    """Whether ``url`` answers 200 within 10 s."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class WheelIndex:
    """A PEP 503 simple index on loopback over a folder of wheels, served from a thread of this process for as
    long as the `with` block lasts: a stand-in for PyTorch's CPU index, whose layout it has."""

    def __init__(self, wheels: Path) -> None:
        files = {path.name: path for path in wheels.glob("*.whl")}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = urllib.parse.unquote(self.path).strip("/").split("/")
                if len(parts) == 2 and parts[0] == "files" and parts[1] in files:
                    self.send(files[parts[1]].read_bytes(), "application/octet-stream")
                elif len(parts) == 1 and parts[0]:
                    links = [
                        f'<a href="/files/{urllib.parse.quote(name)}">{html.escape(name)}</a><br>'
                        for name in sorted(files)
                        if project(name) == project(parts[0])
                    ]
                    if links:
                        self.send("".join(links).encode(), "text/html")
                        return
                    self.send_error(404)
                else:
                    self.send_error(404)

            def send(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WheelIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def project(name: str) -> str:
    """The normalised project name (PEP 503) of a wheel's file name or a project name."""
    return re.sub(r"[-_.]+", "-", name.split("-", 1)[0] if name.endswith(".whl") else name).lower()
