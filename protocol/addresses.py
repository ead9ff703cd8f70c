"""The port convention between the frontend and its engines, in the one place both sides read it.

One address names both sockets: ``tcp://HOST:PORT`` is the request socket (frontend ``ROUTER`` -> engine
``DEALER``) and ``tcp://HOST:PORT+1`` the output socket (engine ``PUSH`` -> frontend ``PULL``). The frontend
binds both (``--engine-bind``); an engine connects to both (``--frontend``).
"""

from __future__ import annotations

from typing import NamedTuple


class EngineAddresses(NamedTuple):
    """The two ZMQ endpoints one ``tcp://HOST:PORT`` address stands for."""

    requests: str  # tcp://HOST:PORT     frontend ROUTER, engine DEALER
    outputs: str  # tcp://HOST:PORT+1   frontend PULL, engine PUSH


def engine_addresses(address: str) -> EngineAddresses:
    """Split ``tcp://HOST:PORT`` into the request and output endpoints; ``ValueError`` if it is not one."""
    host, port = split_address(address)
    requests, outputs = engine_ports(port)
    return EngineAddresses(f"tcp://{host}:{requests}", f"tcp://{host}:{outputs}")


def engine_ports(port: int) -> tuple[int, int]:
    """The (request, output) ports that an engine address's PORT stands for."""
    return port, port + 1


def split_address(address: str) -> tuple[str, int]:
    """(HOST, PORT) of ``tcp://HOST:PORT``; ``ValueError`` if it is not one."""
    scheme, sep, rest = address.partition("://")
    host, colon, port_text = rest.rpartition(":")
    if scheme != "tcp" or not sep or not colon or not host or not port_text.isdigit():
        raise ValueError(
            f"engine address {address!r} must look like tcp://HOST:PORT, e.g. tcp://127.0.0.1:5555"
        )
    port = int(port_text)
    if not 0 < port < 65535:
        raise ValueError(f"engine address {address!r}: PORT must be 1..65534 (PORT+1 is used too)")
    return host, port
