"""The frontend's side of CurveZMQ: making the key folder, loading its key pair and the engine public keys it
admits.

With ``--zmq-curve-keys DIR`` the frontend's ROUTER and PULL are CURVE servers that admit only the engine
public keys in ``DIR/engines/``, and engines are CURVE clients that know the frontend's public key: traffic
is encrypted and a peer without an admitted key gets no frame through. The layout (zmq.auth certificates,
made by :func:`make_keys`, which ``openinfer-keys`` and ``openinfer-serve`` call):

    DIR/frontend.key                    frontend public key     (every engine host needs it)
    DIR/frontend.key_secret             frontend key pair       (the frontend host only)
    DIR/engines/engine-<i>.key          engine i's public key   (the frontend admits every *.key here)
    DIR/engines/engine-<i>.key_secret   engine i's key pair     (engine i's host only)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from openinfer.protocol.private_file import CREATE, open_private

FRONTEND_KEY = "frontend"
ENGINES_DIR = "engines"
KEY_SUFFIXES = (".key", ".key_secret")  # zmq.auth.create_certificates' public and secret key files


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
    """Write a frontend key pair and ``num_engines`` engine key pairs; refuses to overwrite existing keys.

    Key files are 0600 from the moment they exist, and folders made here 0700.
    """
    if not zmq.has("curve"):
        raise ValueError("this libzmq was built without CURVE support")
    engines_dir = folder / ENGINES_DIR
    names = [(folder, FRONTEND_KEY)] + [(engines_dir, f"engine-{i}") for i in range(num_engines)]
    files = [d / f"{name}{suffix}" for d, name in names for suffix in KEY_SUFFIXES]
    existing = [path for path in files if os.path.lexists(path)]  # a dangling link too
    if existing:
        raise ValueError(f"keys exist already ({', '.join(map(str, existing))}); choose an empty folder")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    engines_dir.mkdir(mode=0o700, exist_ok=True)
    for path in files:
        # Made empty, private and new first (nothing planted in its place is followed): create_certificates
        # writes into it (truncating, the mode kept), so the secret key is never in a file another user could
        # open, not even for a moment.
        os.close(open_private(path, CREATE))
    written = []
    for directory, name in names:
        public, secret = zmq.auth.create_certificates(directory, name)
        written += [Path(public), Path(secret)]
    return written
