"""The HTTP port of ``openinfer-serve``: bound once, by serve, and handed to its api servers.

serve binds and listens on ``--host``:``--port`` before it starts anything and passes the listening socket to
each api server, and to each restart of one, as an inherited file descriptor (``openinfer-frontend
--listen-fd``); they all accept from its one queue, and an idle api server accepts more. There is no
``SO_REUSEPORT``, whose only check on Linux is that the sockets sharing a port have the same owner: another
server on the port, of any user, fails to bind it ("port P is in use") rather than joining the port and taking
part of this one's connections. And the port stays held while an api server is restarted: a connection made
meanwhile waits in the queue for an api server that can serve it; it is neither refused nor given to another
process.
"""

from __future__ import annotations

import errno
import socket


def http_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` and listening (``SO_REUSEADDR``, never ``SO_REUSEPORT``);
    OSError saying that the port is in use when another socket holds it."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    try:
        return socket.create_server((host, port), family=family)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        raise OSError(
            f"port {port} is in use on {host}: another server listens there (stop it, or give --port)"
        ) from None
