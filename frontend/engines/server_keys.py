"""The frontend's side of CurveZMQ: loading its key pair and the engine public keys it admits.

With ``--zmq-curve-keys DIR`` the frontend's ROUTER and PULL are CURVE servers that admit only the engine
public keys in ``DIR/engines/``, and engines are CURVE clients that know the frontend's public key: traffic
is encrypted and a peer without an admitted key gets no frame through. The layout (zmq.auth certificates,
made by ``openinfer-keys``, :mod:`openinfer.tools.curve_keys`):

    DIR/frontend.key                    frontend public key     (every engine host needs it)
    DIR/frontend.key_secret             frontend key pair       (the frontend host only)
    DIR/engines/engine-<i>.key          engine i's public key   (the frontend admits every *.key here)
    DIR/engines/engine-<i>.key_secret   engine i's key pair     (engine i's host only)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
