"""Count PostgreSQL round trips on the wire, whoever the client is.

`RoundTripCounter` is a TCP proxy in front of the server. Every request a
client sends (the startup packet, a simple Query, an extended-protocol batch
ending in Sync) is answered by exactly one ReadyForQuery ('Z') message once
the server is done with it; the proxy counts those on their way back. So a
count is the number of request/response exchanges, i.e. round trips, as long
as a client does not pipeline (none of the benchmarked clients does). The
count is updated before the 'Z' is passed on, so it is exact at the moment
the client call that waited for it returns.

The proxy also notes how long each exchange spent beyond it: from passing
the request's first bytes to the server until the 'Z' came back. That is
the server's work, commit included, plus one loopback hop; what a client
call takes beyond it is spent on the client's side.

Only used for counting: timings are taken on direct connections.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass

# Requests answered by one byte instead of a message: the proxy answers "N"
# (not supported) itself, so the rest of the conversation is plain messages.
_SSL_REQUEST, _GSSENC_REQUEST = 80877103, 80877104


@dataclass(frozen=True)
class Count:
    round_trips: int
    connections: int
    server_seconds: float

    def __sub__(self, other: Count) -> Count:
        return Count(
            self.round_trips - other.round_trips,
            self.connections - other.connections,
            self.server_seconds - other.server_seconds,
        )


class _Exchange:
    """The request in flight on one connection, if any."""

    sent_at: float | None = None


class RoundTripCounter:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._round_trips = 0
        self._connections = 0
        self._server_seconds = 0.0
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name="pgwire-accept").start()

    def count(self) -> Count:
        with self._lock:
            return Count(self._round_trips, self._connections, self._server_seconds)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        _close(*sockets)

    def __enter__(self) -> RoundTripCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(self._target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections += 1
                self._sockets |= {client, server}
            exchange = _Exchange()
            for pump in (self._upstream, self._downstream):
                threading.Thread(target=pump, args=(client, server, exchange), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, exchange: _Exchange) -> None:
        """Client to server: answer SSL/GSS encryption requests, then pass everything on."""
        try:
            while True:
                head = _read_exactly(client, 8)
                length, code = struct.unpack("!ii", head)
                if code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                    data = head + _read_exactly(client, length - 8)
                    break
                client.sendall(b"N")
            while data:
                if exchange.sent_at is None:
                    exchange.sent_at = time.perf_counter()
                server.sendall(data)
                data = client.recv(65536)
        except OSError:
            pass
        self._finish(client, server)

    def _downstream(
        self, client: socket.socket, server: socket.socket, exchange: _Exchange
    ) -> None:
        """Server to client: pass everything on, counting ReadyForQuery messages."""
        header = b""  # the part of a message header (type + length) read so far
        left = 0  # bytes of the current message's body still to come
        try:
            while data := server.recv(65536):
                ready = 0
                i = 0
                while i < len(data):
                    if left:
                        step = min(left, len(data) - i)
                        left -= step
                        i += step
                        continue
                    take = min(5 - len(header), len(data) - i)
                    header += data[i : i + take]
                    i += take
                    if len(header) == 5:
                        ready += header[0] == ord("Z")
                        left = struct.unpack("!i", header[1:])[0] - 4
                        header = b""
                if ready:
                    spent = time.perf_counter() - (exchange.sent_at or time.perf_counter())
                    exchange.sent_at = None  # before the client sees the 'Z' and sends again
                    with self._lock:
                        self._round_trips += ready
                        self._server_seconds += spent
                client.sendall(data)
        except OSError:
            pass
        self._finish(client, server)

    def _finish(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets -= set(socks)
        _close(*socks)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
