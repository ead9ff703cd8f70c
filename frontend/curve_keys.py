"""``openinfer-keys DIR``: CurveZMQ keys for the engine sockets, and the frontend's side of loading them.

With ``--zmq-curve-keys DIR`` the frontend's ROUTER and PULL are CURVE servers that admit only the engine
public keys in ``DIR/engines/``, and engines are CURVE clients that know the frontend's public key: traffic
is encrypted and a peer without an admitted key gets no frame through. The layout (zmq.auth certificates):

    DIR/frontend.key                    frontend public key     (every engine host needs it)
    DIR/frontend.key_secret             frontend key pair       (the frontend host only)
    DIR/engines/engine-<i>.key          engine i's public key   (the frontend admits every *.key here)
    DIR/engines/engine-<i>.key_secret   engine i's key pair     (engine i's host only)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

FRONTEND_KEY = "frontend"
ENGINES_DIR = "engines"


@dataclass(frozen=True)
class CurveServerKeys:
    """The frontend's key pair and the folder of engine public keys it admits."""

    public: bytes
    secret: bytes
    engines_dir: Path


def load_server_keys(folder: Path) -> CurveServerKeys:
    """The frontend's keys from an ``openinfer-keys`` folder; ``ValueError`` saying what is missing."""
    secret_file = folder / f"{FRONTEND_KEY}.key_secret"
    engines_dir = folder / ENGINES_DIR
    if not secret_file.is_file():
        raise ValueError(
            f"--zmq-curve-keys: {secret_file} not found; make the keys with `openinfer-keys {folder}`"
        )
    public, secret = zmq.auth.load_certificate(secret_file)
    if secret is None:
        raise ValueError(f"--zmq-curve-keys: {secret_file} holds no secret key")
    if not any(engines_dir.glob("*.key")):
        raise ValueError(f"--zmq-curve-keys: no engine public keys (*.key) in {engines_dir}")
    return CurveServerKeys(public, secret, engines_dir)


def make_keys(folder: Path, num_engines: int) -> list[Path]:
    """Write a frontend key pair and ``num_engines`` engine key pairs; refuses to overwrite existing keys."""
    if not zmq.has("curve"):
        raise ValueError("this libzmq was built without CURVE support")
    engines_dir = folder / ENGINES_DIR
    names = [(folder, FRONTEND_KEY)] + [(engines_dir, f"engine-{i}") for i in range(num_engines)]
    existing = [d / f"{name}.key" for d, name in names if (d / f"{name}.key").exists()]
    if existing:
        raise ValueError(f"keys exist already ({', '.join(map(str, existing))}); choose an empty folder")
    engines_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for directory, name in names:
        public, secret = zmq.auth.create_certificates(directory, name)
        Path(secret).chmod(0o600)
        written += [Path(public), Path(secret)]
    return written


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``openinfer-keys``."""
    parser = argparse.ArgumentParser(
        prog="openinfer-keys",
        description="Make CurveZMQ keys for --zmq-curve-keys DIR: a frontend key pair and one per engine.",
    )
    parser.add_argument("dir", type=Path, help="folder to write the keys into (created if missing)")
    parser.add_argument("--engines", type=int, default=1, help="engine key pairs to make (engine-0 ...)")
    args = parser.parse_args(argv)
    if args.engines < 1:
        parser.error("--engines must be >= 1")
    try:
        written = make_keys(args.dir, args.engines)
    except (ValueError, OSError) as e:
        print(f"openinfer-keys: {e}", file=sys.stderr)
        sys.exit(1)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
