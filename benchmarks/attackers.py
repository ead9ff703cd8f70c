"""Issue 25's and issue 39's attackers, a few lines each, run one after the other by
:mod:`openinfer.benchmarks.attacks`: each takes a :class:`Target`, attacks for about ``Target.seconds`` and
says what it achieved. An attack whose server needs flags of its own (several api servers, an admin key)
names them in :data:`SERVE_FLAGS`.

They use only the HTTP API and the wire protocol (forged messages are encoded with the project's own codec)
and bound every socket operation: where the engine ports authenticate (CurveZMQ) they report the refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from openinfer.benchmarks.attack_target import ADMIN_KEY, Attacker, Target
from openinfer.benchmarks.checkpoint_attacks import bad_checkpoints
from openinfer.benchmarks.counter_attacks import drafter_swaps
from openinfer.benchmarks.drafter_attacks import HOSTILE_DRAFTER_DIR, hostile_drafters
from openinfer.benchmarks.http_attacks import (
    big_bodies,
    big_integers,
    cross_origin,
    error_bodies,
    slow_schemas,
    slowloris,
)
from openinfer.benchmarks.peer_attacks import hostile_peers_dir
from openinfer.benchmarks.serve_attacks import api_server_restart, port_impostor
from openinfer.benchmarks.stream_attacks import cut_choice_streams
from openinfer.benchmarks.template_attacks import hostile_model, hostile_templates
from openinfer.benchmarks.wire_attacks import forged_hellos, garbage_flood, impersonation

__all__ = ["ATTACKERS", "SERVE_FLAGS", "Attacker", "Target"]

ATTACKERS: dict[str, Attacker] = {
    "big_integers": big_integers,
    "garbage_flood": garbage_flood,
    "forged_hellos": forged_hellos,
    "impersonation": impersonation,
    "cross_origin": cross_origin,
    "big_bodies": big_bodies,
    "slow_schemas": slow_schemas,
    "slowloris": slowloris,
    "error_bodies": error_bodies,
    "cut_choice_streams": cut_choice_streams,
    "drafter_swaps": drafter_swaps,
    "hostile_drafters": hostile_drafters,
    "hostile_peers_dir": hostile_peers_dir,
    "port_impostor": port_impostor,
    "api_server_restart": api_server_restart,
    "hostile_templates": hostile_templates,
    "bad_checkpoints": bad_checkpoints,
}

# The openinfer-serve flags an attack's server gets besides --serve-arg's: a list, or a function that makes
# what they name (a model folder) in the attack's own folder and returns them.
SERVE_FLAGS: dict[str, list[str] | Callable[[Path], list[str]]] = {
    "drafter_swaps": ["--api-server-count", "3", "--admin-api-key", ADMIN_KEY],
    "hostile_drafters": ["--admin-api-key", ADMIN_KEY, f"--allowed-drafter-dir={HOSTILE_DRAFTER_DIR}"],
    "hostile_peers_dir": ["--api-server-count", "2"],
    "port_impostor": ["--api-server-count", "2"],
    "api_server_restart": ["--api-server-count", "2"],
    "hostile_templates": hostile_model,
}
