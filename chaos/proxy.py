"""A TCP proxy in front of a database that a test or the nemesis can cut, freeze and restore.

An outage without touching the server itself, in the forms a network gives:

- `cut`: every connection through the proxy dropped (reset), new ones turned
  away — a server that went away, or a route that answers "no";
- `refuse_new`: only new connections turned away, the open ones kept (a server
  "too busy" for one more, as with PostgreSQL's 53300);
- `stall_new`: new connections taken in and never answered, the open ones kept
  (a server too slow to reach);
- `freeze`: a **partition**, a blackhole — nothing crosses in either direction
  and nothing answers, but nothing is closed either: what a failed switch, a
  firewall rule that drops packets or a dead route does to a host. Bytes sent
  meanwhile wait in the proxy (the kernel acknowledges them, as a peer's
  kernel would until its buffers fill); new connections are taken in and
  left silent; a connection one side closes meanwhile is closed on the other
  side only after the thaw. `thaw` (or `restore`) heals it: held bytes, and
  closes, flow on and the silent connections are put through, as TCP
  retransmission would after a real partition.

The pumps are threads of the process that made the proxy: freezing the proxy
never pauses that process.
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
        self._flowing = threading.Event()
        """Set while bytes may cross: cleared by `freeze`."""
        self._flowing.set()
        self._closed = False
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        """``host:port`` of the proxy."""
        return f"127.0.0.1:{self.port}"

    def url(self, url: str) -> str:
        """A store URL of the proxied server, pointed at the proxy instead."""
        host, port = self._target
        assert f"@{host}:{port}/" in url, url
        return url.replace(f"@{host}:{port}/", f"@127.0.0.1:{self.port}/")

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

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
            if self._stalling or self.frozen:
                with self._lock:
                    self._stalled.append(client)  # open and silent until restored
                continue
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._target)
        except OSError:
            client.close()
            return
        with self._lock:
            self._pairs.append((client, upstream))
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                self._flowing.wait()
                data = source.recv(65536)
                self._flowing.wait()  # read as the freeze began: held until the thaw
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            self._flowing.wait()
        # One end closed (or reset) its connection: the other learns it only once bytes
        # cross again, as a FIN or RST sent into a partition arrives after it heals.
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every connection and refuse new ones, as a server that went away."""
        self._accepting = False
        self._flowing.set()
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

    def freeze(self) -> None:
        """A partition: nothing crosses, nothing answers, nothing is closed."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Heal a partition: held bytes flow on, silent new connections are put through."""
        self._flowing.set()
        with self._lock:
            waiting, self._stalled = self._stalled, []
        if self._stalling:  # `stall_new` still holds them
            with self._lock:
                self._stalled.extend(waiting)
            return
        for client in waiting:
            self._connect(client)

    def restore(self) -> None:
        """Everything as before: connections accepted and put through, nothing frozen."""
        self._accepting = True
        self._stalling = False
        if self.frozen:
            self.thaw()
        self._drop_stalled()

    def _drop_stalled(self) -> None:
        """Stop stalling: close the connections taken in and never answered."""
        self._stalling = False
        with self._lock:
            stalled, self._stalled = self._stalled, []
        for client in stalled:
            client.close()

    def close(self) -> None:
        self.cut()
        self._closed = True
        self._server.close()
