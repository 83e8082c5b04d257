"""The socket ``cord-ops serve`` listens on: TCP, so that small answers on a keep-alive
connection are sent at once instead of waiting for the client's delayed ACK."""

from __future__ import annotations

import asyncio
import socket

from flows.serve.app import bind


def _accepted_nodelay(listener: socket.socket) -> int:
    """TCP_NODELAY of the connection the event loop accepts on ``listener``, served the way
    uvicorn serves a socket it is handed (``loop.create_server(sock=...)``)."""

    async def main() -> int:
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                accepted.set_result(transport.get_extra_info("socket").getsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        try:
            host, port = listener.getsockname()[:2]
            _, writer = await asyncio.open_connection(host, port)
            value = await asyncio.wait_for(accepted, 10)
            writer.close()
            return value
        finally:
            server.close()

    return asyncio.run(main())


def test_served_connections_have_tcp_nodelay():
    """uvicorn writes a response's headers and body in two sends; without TCP_NODELAY the
    second waits for the client's delayed ACK (Nagle), ~40 ms on Linux for a one-row
    answer. asyncio sets the option only on connections of a socket whose proto is TCP."""
    listener = bind("127.0.0.1", 0)
    try:
        assert _accepted_nodelay(listener) != 0
    finally:
        listener.close()
