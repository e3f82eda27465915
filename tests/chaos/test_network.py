"""The run's network: each worker's own proxies (frozen one slot at a time), the URLs that
name them, a close held back by a frozen proxy, and etcd's peer links cut one member off."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from chaos.config import Config
from chaos.network import PeerLinks, WorkerLinks, _sender, endpoints, through
from chaos.proxy import Proxy


@pytest.fixture
def echo() -> Iterator[tuple[int, list[socket.socket]]]:
    """A server that sends back what it reads; its port, and the connections it took."""
    server = socket.create_server(("127.0.0.1", 0))
    taken: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)
        conn.close()

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                taken.append(conn)
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], taken
    server.close()


def _talk(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    conn = socket.create_connection((host, int(port)))
    conn.settimeout(0.3)
    return conn


def _answered(conn: socket.socket, message: bytes) -> bool:
    conn.sendall(message)
    try:
        return conn.recv(100) == message
    except TimeoutError:
        return False


def test_a_frozen_slot_hears_nothing_while_the_others_go_on(
    echo: tuple[int, list[socket.socket]],
) -> None:
    port, _ = echo
    links = WorkerLinks([("127.0.0.1", port)], 2)
    try:
        first, second = (_talk(links.addresses(slot)[0]) for slot in range(2))
        assert _answered(first, b"a") and _answered(second, b"b")
        links.freeze([0])
        assert links.frozen(0) and not links.frozen(1)
        assert not _answered(first, b"c")  # a blackhole: no answer, no error
        assert _answered(second, b"d")
        late = _talk(links.addresses(0)[0])  # a new connection is taken in, left silent
        assert not _answered(late, b"e")
        links.thaw([0])
        first.settimeout(2.0)
        late.settimeout(2.0)
        assert first.recv(100) == b"c"  # held, then delivered, as TCP would after the heal
        assert late.recv(100) == b"e"
    finally:
        links.close()


def test_a_close_during_a_freeze_reaches_the_server_only_after_the_thaw() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    proxy = Proxy(("127.0.0.1", server.getsockname()[1]))
    try:
        client = _talk(proxy.address)
        server_side, _ = server.accept()
        server_side.settimeout(2.0)
        client.sendall(b"a")
        assert server_side.recv(100) == b"a"
        proxy.freeze()
        client.close()
        server_side.settimeout(0.3)
        with pytest.raises(TimeoutError):  # no FIN crosses a partition
            server_side.recv(100)
        proxy.thaw()
        server_side.settimeout(2.0)
        assert server_side.recv(100) == b""  # the close, once the partition healed
    finally:
        proxy.close()
        server.close()


@pytest.mark.parametrize(
    ("url", "found", "proxied"),
    [
        (
            "postgresql://postgres@127.0.0.1:5432/test?schema=chaos_7",
            [("127.0.0.1", 5432)],
            "postgresql://postgres@127.0.0.1:9001/test?schema=chaos_7",
        ),
        (
            "mysql://root@127.0.0.1/chaos_7",
            [("127.0.0.1", 3306)],
            "mysql://root@127.0.0.1:9001/chaos_7",
        ),
        (
            "etcd://127.0.0.1:2379,127.0.0.1:2380,127.0.0.1:2381/chaos_7",
            [("127.0.0.1", 2379), ("127.0.0.1", 2380), ("127.0.0.1", 2381)],
            "etcd://127.0.0.1:9001,127.0.0.1:9002,127.0.0.1:9003/chaos_7",
        ),
    ],
)
def test_a_workers_url_names_its_own_proxies(
    url: str, found: list[tuple[str, int]], proxied: str
) -> None:
    assert endpoints(url) == found
    proxies = [f"127.0.0.1:{9001 + i}" for i in range(len(found))]
    assert through(url, proxies) == proxied


def test_a_store_on_a_local_socket_cannot_be_proxied() -> None:
    with pytest.raises(ValueError, match="no TCP address"):
        endpoints("postgresql:///test?host=/var/run/postgresql")


def test_the_config_gives_each_slot_its_proxies_and_postgres_its_name() -> None:
    config = Config(
        backend="postgres",
        url="postgresql://postgres@127.0.0.1:5432/test?schema=chaos_7",
        run_id="7",
        seed=7,
        duration=1.0,
        history="h",
        board="b",
        workers=2,
        proxies=[["127.0.0.1:9001"], ["127.0.0.1:9002"]],
    )
    assert config.partitions
    assert config.worker_url(1) == (
        "postgresql://postgres@127.0.0.1:9002/test?schema=chaos_7&application_name=chaos-7-w1"
    )
    assert Config.from_json(config.to_json()) == config


def test_a_peer_request_names_its_sender() -> None:
    head = b"GET /raft/stream/message/a1 HTTP/1.1\r\nHost: x\r\nX-Server-From: A1b2\r\n\r\nbody"
    assert _sender(head) == "a1b2"
    assert _sender(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n") is None


def test_a_cut_member_neither_sends_nor_hears_while_the_others_talk(
    echo: tuple[int, list[socket.socket]],
) -> None:
    port, _ = echo
    links = PeerLinks([port, port, port])  # three "members": the same echo behind each
    links.name_members({0xA: 0, 0xB: 1, 0xC: 2})

    def dial(sender: str, member: int) -> socket.socket:
        conn = _talk(f"127.0.0.1:{links.ports[member]}")
        head = f"GET /raft HTTP/1.1\r\nX-Server-From: {sender}\r\n\r\n".encode()
        assert _answered(conn, head)
        return conn

    try:
        from_cut, to_cut, between = dial("a", 1), dial("b", 0), dial("b", 2)
        probe = _talk(f"127.0.0.1:{links.ports[1]}")  # no sender: a health probe
        assert _answered(probe, b"GET /version HTTP/1.1\r\n\r\n")
        links.cut(0)
        assert links.cut_members == {0}
        assert not _answered(from_cut, b"x")  # member 0's own link to member 1
        assert not _answered(to_cut, b"y")  # member 1's link to member 0
        assert _answered(between, b"z")  # 1 and 2 still talk
        assert _answered(probe, b"p")
        links.heal(0)
        for conn, held in ((from_cut, b"x"), (to_cut, b"y")):
            conn.settimeout(2.0)
            assert conn.recv(100) == held
        assert _answered(to_cut, b"w")
    finally:
        links.close()
