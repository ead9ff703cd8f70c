"""serve's HTTP listening socket: no other socket, even one of the same user with ``SO_REUSEPORT``, can join
its port, and a port in use is refused saying so."""

from __future__ import annotations

import socket

import pytest

from openinfer.engine_core.launch.http_listener import http_listener
from openinfer.engine_core.launch.local_cluster import HOST, free_port


def test_no_socket_joins_the_port_not_even_with_so_reuseport() -> None:
    """The listener listens without SO_REUSEPORT, so a same-user socket with SO_REUSEPORT (how api servers
    shared the port before) cannot bind the port beside it."""
    with http_listener(HOST, free_port()) as listener:
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0
        with socket.socket() as impostor:
            impostor.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            with pytest.raises(OSError, match="Address already in use"):
                impostor.bind(listener.getsockname())


def test_a_port_in_use_is_refused_saying_so() -> None:
    """A second listener on the port: OSError naming the port and the host."""
    port = free_port()
    with http_listener(HOST, port), pytest.raises(OSError, match=f"^port {port} is in use on {HOST}: "):
        http_listener(HOST, port)
