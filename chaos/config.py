"""What a run is: the settings the controller, the workers and the nemesis share.

The controller writes them as the first record of the history and hands
them to every worker as JSON on its command line, so a run is described in
one place and the checker knows what it is looking at (the TTL, whether
fencing was on).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from chaos.network import through


@dataclass(frozen=True)
class Config:
    backend: str
    """"sqlite", "postgres", "etcd" or "mysql"."""
    url: str
    """The store's URL (a file, a schema or an etcd key prefix of the run's own)."""
    run_id: str
    """Names this run's sessions (app id) and PostgreSQL connections (application_name)."""
    seed: int
    duration: float
    history: str
    board: str
    """A file of one byte per worker saying what it is doing (see `worker.Board`)."""
    workers: int = 6
    names: int = 4
    ttl: float = 2.0
    """Short, so that a dead holder's locks come free quickly."""
    fencing: bool = True
    allow_restart: bool = False
    restart_every: float = 300.0
    """At most one PostgreSQL restart per this many seconds (others share the server)."""
    crash: bool = False
    """Restarts are crashes: an immediate shutdown, which skips the checkpoint and makes
    the server recover from its log (commits not yet flushed are lost)."""
    clock_steps: bool = False
    """The nemesis also steps workers' wall clocks (`chaos.clock`)."""
    durability: str = "durable"
    """The workers' `lockwarden.connect(durability=...)`: "relaxed" loses recent grants
    and releases in a crash, the case `crash` tests."""
    fault_every: float = 3.0
    """Mean seconds between the nemesis's faults."""
    hold: float = 0.25
    """The longest sleep inside a critical section, in TTLs (half the operations sleep):
    the window where a pause makes a holder outlive its lease. Shorter makes more
    operations per second, for a run that must count many."""
    think: float = 0.05
    """The longest pause, in seconds, between one worker's operations."""
    dump_stalls: bool = False
    """Each worker writes every thread's stack to ``<history>.stalls/`` when an acquire runs
    `worker.STALL_GRACE` past its timeout (`worker.StallDumps`)."""
    proxies: list[list[str]] | None = None
    """Per worker slot, the addresses ("127.0.0.1:PORT") of the proxies through which its
    worker reaches the store, one per server endpoint in the URL's order
    (`chaos.network.WorkerLinks`); None: the workers connect straight (SQLite, or
    ``--no-partitions``)."""
    local_deadline: bool = True
    """False for the control run (``--no-local-deadline``): the workers switch the library's
    local lease deadline off, so a session is lost only when the database says so."""

    @property
    def app_id(self) -> str:
        return f"chaos-{self.run_id}"

    @property
    def lock_names(self) -> list[str]:
        return [f"n{i}" for i in range(self.names)]

    def application_name(self, slot: int) -> str:
        """The PostgreSQL application_name of one worker's connections."""
        return f"{self.app_id}-w{slot}"

    @property
    def partitions(self) -> bool:
        """Whether the workers reach the store through proxies the nemesis can freeze."""
        return self.proxies is not None

    def worker_url(self, slot: int) -> str:
        """The store URL a worker connects with: through its own proxies, if any; on
        PostgreSQL its connections carry its name."""
        url = self.url if self.proxies is None else through(self.url, self.proxies[slot])
        if self.backend != "postgres":
            return url
        parts = urlsplit(url)
        query = [*parse_qsl(parts.query), ("application_name", self.application_name(slot))]
        return urlunsplit(parts._replace(query=urlencode(query)))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls(**json.loads(text))
