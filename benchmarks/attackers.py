"""Issue 25's attackers, a few lines each, run one after the other by :mod:`openinfer.benchmarks.attacks`:
each takes a :class:`Target`, attacks for about ``Target.seconds`` and says what it achieved.

They use only the HTTP API and the wire protocol (forged messages are encoded with the project's own codec)
and bound every socket operation: where the engine ports authenticate (CurveZMQ) they report the refusal.
"""

from __future__ import annotations

from openinfer.benchmarks.attack_target import Attacker, Target
from openinfer.benchmarks.http_attacks import (
    big_bodies,
    big_integers,
    cross_origin,
    error_bodies,
    slow_schemas,
    slowloris,
)
from openinfer.benchmarks.wire_attacks import forged_hellos, garbage_flood, impersonation

__all__ = ["ATTACKERS", "Attacker", "Target"]

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
}
