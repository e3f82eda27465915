"""Which failed requests the etcd client counts as possibly applied.

A request is sent again to the next member when one fails; whether the first
copy may still be applied decides how the answer is read (a release that finds
nothing, a reclaim's count) and whether a grant may arrive late (the etcd backend's
design note, "Writes that arrive late"). Only a refused connection sent nothing. Each
test puts a misbehaving member, a real socket on loopback, before a real one.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from chaos.etcd_cluster import EtcdCluster
from lockwarden.store.backends.base import Stats
from lockwarden.store.backends.etcd.cluster import Cluster, get
from lockwarden.store.opening import parse_url


def _serve(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A member on a free loopback port that takes each connection and does ``answer``."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                answer(conn)

    threading.Thread(target=run, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


def _read_then_drop(conn: socket.socket) -> None:
    conn.recv(65536)  # the request arrived: the member could have applied it
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def _answer_cut_short(conn: socket.socket) -> None:
    conn.recv(65536)  # applied, say; the member dies halfway through its answer
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n40\r\n" + b'{"header": {"revision": "7"},'
    )


def _read_then_hang(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.recv(65536)  # until the client gives up and closes


@pytest.fixture
def dropping() -> Iterator[int]:
    yield from _serve(_read_then_drop)


@pytest.fixture
def cut_short() -> Iterator[int]:
    yield from _serve(_answer_cut_short)


@pytest.fixture
def hanging() -> Iterator[int]:
    yield from _serve(_read_then_hang)


@pytest.fixture
def refusing() -> int:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        return int(taken.getsockname()[1])  # closed again: nothing listens there


def _first_then(port: int, etcd_cluster: EtcdCluster) -> Cluster:
    real = etcd_cluster.url("lw_kv").split("//", 1)[1].split(",", 1)[0]
    return Cluster(parse_url(f"etcd://127.0.0.1:{port},{real}/lw_kv"), Stats())


def test_a_refused_connection_sent_nothing(refusing: int, etcd_cluster: EtcdCluster) -> None:
    _, resent = _first_then(refusing, etcd_cluster).post("/kv/txn", {"success": [get("k")]})
    assert not resent


def test_a_connection_dropped_after_the_request_may_have_applied_it(
    dropping: int, etcd_cluster: EtcdCluster
) -> None:
    _, resent = _first_then(dropping, etcd_cluster).post("/kv/txn", {"success": [get("k")]})
    assert resent


def test_a_member_that_never_answers_may_have_applied_it(
    hanging: int, etcd_cluster: EtcdCluster
) -> None:
    _, resent = _first_then(hanging, etcd_cluster).post("/kv/txn", {"success": [get("k")]})
    assert resent


def test_an_answer_cut_short_is_asked_of_the_next_member(
    cut_short: int, etcd_cluster: EtcdCluster
) -> None:
    """A member killed while it answered: the request may have been applied, and the call
    goes on to the next member instead of failing with the HTTP library's error."""
    found, resent = _first_then(cut_short, etcd_cluster).post("/kv/txn", {"success": [get("k")]})
    assert resent
    assert int(found["header"]["revision"]) > 0
