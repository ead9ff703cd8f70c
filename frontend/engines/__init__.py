"""The engine boundary: sockets, handshake, registry, routing, liveness and drafter commands."""
