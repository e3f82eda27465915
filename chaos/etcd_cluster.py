"""A private etcd cluster: members on free loopback ports, data in a directory of its own.

The chaos harness (``--backend etcd``) and the tests start one; the nemesis
and the fault tests kill, pause and restart its members through
`EtcdCluster`. Nothing here touches any etcd the machine may run.

With ``peer_proxies`` the members reach one another through proxies
(`chaos.network.PeerLinks`): each member listens for its peers on a port of
its own and advertises the port of a proxy in front of it, so that `cut` can
cut one member off from the other two (both directions) while its clients
still reach it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from etcd3gw.client import Etcd3Client

from chaos.network import PeerLinks

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class EtcdCluster:
    """``size`` etcd members on loopback, started together."""

    def __init__(self, root: Path, size: int = 3, *, peer_proxies: bool = False) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * size)
        self.client_ports = ports[:size]
        self.peer_ports = ports[size:]
        self.links = PeerLinks(self.peer_ports) if peer_proxies else None
        self.advertised = self.peer_ports if self.links is None else self.links.ports
        """The peer port each member advertises: its own, or its proxy's."""
        self.names = [f"m{i}" for i in range(size)]
        self.initial = ",".join(
            f"{name}=http://127.0.0.1:{port}"
            for name, port in zip(self.names, self.advertised, strict=True)
        )
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size
        for i in range(size):
            self.start(i)
        self.wait_healthy()
        if self.links is not None:
            self.links.name_members(self.member_ids())

    @property
    def cuttable(self) -> bool:
        """Whether `cut` can cut a member off (the peers talk through proxies)."""
        return self.links is not None

    def cut(self, i: int) -> None:
        """Cut member ``i`` off from the others: nothing crosses between them either way."""
        assert self.links is not None, "start the cluster with peer_proxies=True"
        self.links.cut(i)

    def heal(self, i: int) -> None:
        assert self.links is not None
        self.links.heal(i)

    def member_ids(self) -> dict[int, int]:
        """Each running member's id -> its index."""
        return {
            int(self.member(i).status()["header"]["member_id"]): i
            for i, proc in enumerate(self.procs)
            if proc is not None
        }

    @property
    def size(self) -> int:
        return len(self.procs)

    @property
    def endpoints(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.client_ports)

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoints}/{prefix}"

    def start(self, i: int) -> None:
        """Start (or restart, keeping its data) member ``i``."""
        client = f"http://127.0.0.1:{self.client_ports[i]}"
        data = self.root / self.names[i]
        log = (self.root / f"{self.names[i]}.log").open("ab")
        self.procs[i] = subprocess.Popen(
            [
                ETCD,
                "--name", self.names[i],
                "--data-dir", str(data),
                "--listen-client-urls", client,
                "--advertise-client-urls", client,
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.advertised[i]}",
                "--initial-cluster", self.initial,
                "--initial-cluster-state", "new",
                "--initial-cluster-token", f"lw-{os.getpid()}-{self.peer_ports[0]}",
                # Short elections: a lost leader is replaced in well under a second.
                "--heartbeat-interval", "25",
                "--election-timeout", "250",
                "--max-txn-ops", "4096",
                "--snapshot-count", "10000",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.procs[i] = None

    def pause(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)

    def resume(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGCONT)

    def member(self, i: int) -> Etcd3Client:
        return Etcd3Client(host="127.0.0.1", port=self.client_ports[i], api_path="/v3/", timeout=1)

    def leader(self) -> int:
        """The index of the current leader (asked of the running members)."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for i, proc in enumerate(self.procs):
                if proc is None:
                    continue
                try:
                    status = self.member(i).status()
                except Exception:
                    continue
                leader = int(status.get("leader", 0))
                for j, other in enumerate(self.procs):
                    if other is None:
                        continue
                    try:
                        if int(self.member(j).status()["header"]["member_id"]) == leader:
                            return j
                    except Exception:
                        continue
            time.sleep(0.1)
        raise AssertionError("the etcd cluster has no leader")

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until a write through every running member succeeds."""
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            while True:
                try:
                    self.member(i).put("lw-health", "ok")
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"etcd member {i} is not healthy: see {self.root}/{self.names[i]}.log"
                        ) from None
                    time.sleep(0.1)

    def delete_prefix(self, prefix: str) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None:
                try:
                    self.member(i).delete_prefix(prefix + "/")
                    return
                except Exception:
                    continue

    def stop(self) -> None:
        for i in range(len(self.procs)):
            proc = self.procs[i]
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.procs[i] = None
        if self.links is not None:
            self.links.close()
