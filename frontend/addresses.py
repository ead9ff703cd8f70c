"""The frontend's side of its addresses: the port convention with its engines is ``protocol/addresses.py``'s
(both sides read it there); whether a host is reachable from this machine only."""

from __future__ import annotations

import ipaddress

from openinfer.protocol.addresses import EngineAddresses, engine_addresses, engine_ports, split_address

__all__ = ["EngineAddresses", "engine_addresses", "engine_ports", "is_loopback_host", "split_address"]


def is_loopback_host(host: str) -> bool:
    """Whether listening on ``host`` is reachable from this machine only: ``localhost``, 127.0.0.0/8 or
    ``::1`` (bracketed or not). Anything else (0.0.0.0, ``*``, an interface name, a host name) is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False
