"""A TCP proxy in front of the test PostgreSQL that a test can cut and restore.

An outage without touching the shared server: `cut` drops every connection
through the proxy and turns new ones away; `refuse_new` only turns new ones
away (the server "too busy" for one more, as with 53300), keeping the open
ones; `stall_new` takes new ones in and never answers (a server too slow to
reach); `restore` lets connections through again.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.1)
        self.port: int = self._server.getsockname()[1]
        self._accepting = True
        self._stalling = False
        self._stalled: list[socket.socket] = []
        self._closed = False
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        """A store URL of the proxied server, pointed at the proxy instead."""
        host, port = self._target
        assert f"@{host}:{port}/" in url, url
        return url.replace(f"@{host}:{port}/", f"@127.0.0.1:{self.port}/")

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._accepting:
                client.close()
                continue
            if self._stalling:
                self._stalled.append(client)  # open and silent until `restore`
                continue
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every connection and refuse new ones, as a server that went away."""
        self._accepting = False
        self._drop_stalled()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for end in pair:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def refuse_new(self) -> None:
        """Turn new connections away, keeping the open ones."""
        self._accepting = False

    def stall_new(self) -> None:
        """Take new connections in and never answer them, keeping the open ones."""
        self._stalling = True

    def restore(self) -> None:
        self._accepting = True
        self._drop_stalled()

    def _drop_stalled(self) -> None:
        """Stop stalling: close the connections taken in and never answered."""
        self._stalling = False
        stalled, self._stalled = self._stalled, []
        for client in stalled:
            client.close()

    def close(self) -> None:
        self.cut()
        self._closed = True
        self._server.close()
