"""A run's network: each worker's way to the store through proxies of its own, and on etcd
the members' links to one another, so that the nemesis can partition them.

`WorkerLinks`: one `chaos.proxy.Proxy` per worker slot and per server
endpoint (PostgreSQL's or MariaDB's one address, each of etcd's client
ports). A worker's store URL names its own proxies (`Config.worker_url`), so
freezing them cuts that worker, and only it, off from the store: nothing
crosses, nothing answers, nothing is closed. A worker restarted in a slot
uses the slot's proxies.

`PeerLinks`: one proxy in front of each etcd member's peer port, which the
members advertise to one another (`EtcdCluster(peer_proxies=True)`), so every
connection from one member to another goes through the proxy of the member
dialed. A connection is put down to the member that dialed it by the
``X-Server-From`` header of its first request (etcd's peer requests carry the
sender's member id), so `cut` blackholes every link *from or to* one member:
the member is cut off from the majority in both directions, while clients
still reach it. A connection that names no sender (health probes, version
checks) is cut only if it goes to the cut member.

All of it runs in threads of the controller process: freezing a proxy never
pauses anything else.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

from chaos.proxy import Proxy

DEFAULT_PORTS = {"postgresql": 5432, "postgres": 5432, "mysql": 3306, "mariadb": 3306}


def endpoints(url: str) -> list[tuple[str, int]]:
    """The TCP addresses a store URL names, in its order (etcd: every member).

    `ValueError` if the URL names none (a local socket): such a store cannot be
    reached through a proxy.
    """
    parts = urlsplit(url)
    if parts.scheme == "etcd":
        found = []
        for endpoint in parts.netloc.split(","):
            host, _, port = endpoint.rpartition(":")
            found.append((host, int(port)))
        return found
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or "host=" in parts.query:
        raise ValueError(f"no TCP address in {parts.scheme}:// URL: cannot put a proxy before it")
    return [(parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme])]


def through(url: str, proxies: list[str]) -> str:
    """``url`` with its server address(es) replaced by ``proxies`` ("127.0.0.1:PORT"),
    in the order `endpoints` gives them."""
    parts = urlsplit(url)
    user, at, _ = parts.netloc.rpartition("@")
    netloc = f"{user}{at}{','.join(proxies)}"
    return parts._replace(netloc=netloc).geturl()


class WorkerLinks:
    """One proxy per worker slot and per endpoint of the store."""

    def __init__(self, targets: list[tuple[str, int]], workers: int) -> None:
        self._proxies = [[Proxy(target) for target in targets] for _ in range(workers)]

    def addresses(self, slot: int) -> list[str]:
        """The slot's proxies, one per endpoint, as `through` wants them."""
        return [proxy.address for proxy in self._proxies[slot]]

    def freeze(self, slots: Iterable[int]) -> None:
        """A partition of these workers: nothing between them and the store crosses."""
        for slot in slots:
            for proxy in self._proxies[slot]:
                proxy.freeze()

    def thaw(self, slots: Iterable[int]) -> None:
        for slot in slots:
            for proxy in self._proxies[slot]:
                proxy.thaw()

    def frozen(self, slot: int) -> bool:
        return all(proxy.frozen for proxy in self._proxies[slot])

    def close(self) -> None:
        for proxies in self._proxies:
            for proxy in proxies:
                proxy.close()


SNIFF_TIMEOUT = 2.0
"""Seconds a new peer connection may take to send its first request's header."""


def _sender(head: bytes) -> str | None:
    """The ``X-Server-From`` header of a request's head (an etcd member id in hex)."""
    for line in head.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-server-from":
            return value.strip().decode("ascii", "replace").lower()
    return None


class PeerLinks:
    """A proxy in front of each member's peer port; `cut` cuts one member off from the rest."""

    def __init__(self, targets: list[int]) -> None:
        self._targets = targets
        self._cond = threading.Condition()
        self._cut: set[int] = set()
        self._ids: dict[str, int] = {}
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._servers = [socket.create_server(("127.0.0.1", 0)) for _ in targets]
        self.ports = [server.getsockname()[1] for server in self._servers]
        for member, server in enumerate(self._servers):
            server.settimeout(0.1)
            threading.Thread(target=self._accept, args=(server, member), daemon=True).start()

    def name_members(self, ids: dict[int, int]) -> None:
        """Member id -> index, from the members themselves (`EtcdCluster.member_ids`)."""
        with self._cond:
            self._ids = {format(member_id, "x"): i for member_id, i in ids.items()}

    def cut(self, member: int) -> None:
        """Blackhole every link from or to ``member`` (open ones and new ones)."""
        with self._cond:
            self._cut.add(member)

    def heal(self, member: int) -> None:
        with self._cond:
            self._cut.discard(member)
            self._cond.notify_all()

    @property
    def cut_members(self) -> set[int]:
        with self._cond:
            return set(self._cut)

    def _open(self, sender: str | None, member: int) -> bool:
        dialer = None if sender is None else self._ids.get(sender)
        return self._closed or not ({member, dialer} & self._cut)

    def _wait_open(self, sender: str | None, member: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._open(sender, member))

    def _accept(self, server: socket.socket, member: int) -> None:
        while not self._closed:
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client, member), daemon=True).start()

    def _serve(self, client: socket.socket, member: int) -> None:
        head = b""
        client.settimeout(SNIFF_TIMEOUT)
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = client.recv(65536)
                if not chunk:
                    break
                head += chunk
        client.settimeout(None)
        sender = _sender(head)
        self._wait_open(sender, member)  # a new link to or from a cut member: silent until healed
        try:
            upstream = socket.create_connection(("127.0.0.1", self._targets[member]))
            upstream.sendall(head)
        except OSError:  # the member is down (killed): as its closed port would
            client.close()
            return
        with self._cond:
            self._sockets += [client, upstream]
        threading.Thread(
            target=self._pump, args=(upstream, client, sender, member), daemon=True
        ).start()
        self._pump(client, upstream, sender, member)

    def _pump(
        self, source: socket.socket, sink: socket.socket, sender: str | None, member: int
    ) -> None:
        try:
            while True:
                self._wait_open(sender, member)
                data = source.recv(65536)
                self._wait_open(sender, member)  # read as the cut began: held until healed
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            self._wait_open(sender, member)
        for end in (source, sink):  # shut down, not closed: the other pump may still read
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        with self._cond:
            for end in (source, sink):
                with contextlib.suppress(ValueError):
                    self._sockets.remove(end)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            ends, self._sockets = self._sockets, []
        for server in self._servers:
            server.close()
        for end in ends:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
