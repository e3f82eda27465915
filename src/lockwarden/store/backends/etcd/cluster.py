"""The etcd cluster as the etcd backend sees it: transactions, leases and one watch.

Everything goes through etcd's v3 JSON gateway with `etcd3gw` (`backends/etcd/README.md`,
"The client library"). This module knows keys, values and revisions,
and nothing of locks:

- `Cluster.post` sends one request to one member and moves on to the next
  member when that one fails, so one dead or paused member costs one
  timeout, not the call, and the next call starts at the next member. Every
  request has a deadline (`CALL_TIMEOUT`, or half of what is left of the call
  if that is less, so that another member is asked in time) and every call a
  budget, the store's call timeout (`bounds`): a cluster that has lost its
  quorum answers nothing (or "no leader"), and a partition nothing at all;
  the caller then gets a `StoreError` within the budget instead of hanging.
- `Watch` is one stream of change events under the store's prefix, kept open
  by a thread; a broken stream is resumed from the revision after the last
  one seen, so no event is lost across a reconnect (unless etcd compacted
  that history away: then every waiter is woken once).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from etcd3gw import exceptions
from etcd3gw.client import Etcd3Client
from urllib3.exceptions import NewConnectionError

from lockwarden import hooks
from lockwarden.errors import StoreError
from lockwarden.store import bounds, process
from lockwarden.store.backends.base import STORE_LOG, Stats
from lockwarden.store.url import StoreURL

CALL_TIMEOUT = 1.0
"""Seconds one member has to answer one request before the next member is asked. A
lost quorum makes members wait for a leader that is not coming (etcd's own request
timeout is longer), and a paused member accepts connections but never answers; a
heartbeat stuck on either must move on well within a session's TTL."""

_RETRYABLE = (
    exceptions.ConnectionFailedError,
    exceptions.ConnectionTimeoutError,
    exceptions.InternalServerError,
    requests.exceptions.RequestException,
)
"""Failures another member (or the same one, after an election) may not have: the
member is down, paused, partitioned, or has no leader, or its answer was cut short
(a member killed while it answered: `requests`' own error, which etcd3gw lets
through). Anything else (a request etcd refuses) fails at once."""

Op = dict[str, Any]


def enc(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def dec(text: str) -> str:
    return base64.b64decode(text).decode("utf-8")


def prefix_end(prefix: str) -> str:
    """The end of the key range of every key starting with ``prefix`` (which ends in "/")."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


@dataclass(frozen=True)
class KV:
    """One key as read: its JSON value and the revisions etcd keeps for it."""

    key: str
    value: Any
    create: int
    """The revision that created the key: a lock's fencing token, a waiter's place."""
    mod: int


def _kv(raw: Mapping[str, Any]) -> KV:
    value = dec(raw["value"]) if raw.get("value") else ""
    return KV(
        key=dec(raw["key"]),
        value=json.loads(value) if value else None,
        create=int(raw.get("create_revision", 0)),
        mod=int(raw.get("mod_revision", 0)),
    )


# -- the pieces of a transaction --------------------------------------------------


def get(key: str) -> Op:
    return {"request_range": {"key": enc(key)}}


def scan(prefix: str, *, limit: int = 0) -> Op:
    """Every key under ``prefix`` (up to ``limit`` if given)."""
    return {
        "request_range": {"key": enc(prefix), "range_end": enc(prefix_end(prefix)), "limit": limit}
    }


def put(key: str, value: object, lease: int = 0) -> Op:
    body: dict[str, Any] = {"key": enc(key), "value": enc(json.dumps(value))}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete(key: str) -> Op:
    return {"request_delete_range": {"key": enc(key), "prev_kv": True}}


def exists(key: str) -> Op:
    return {"key": enc(key), "target": "VERSION", "result": "GREATER", "version": "0"}


def absent(key: str, *, under: bool = False) -> Op:
    """The key does not exist (with ``under``: no key exists under the prefix ``key``;
    etcd judges an empty range as one missing key)."""
    compare = {"key": enc(key), "target": "VERSION", "result": "EQUAL", "version": "0"}
    if under:
        compare["range_end"] = enc(prefix_end(key))
    return compare


def nested(success: Sequence[Op], compare: Sequence[Op]) -> Op:
    """A transaction inside another (etcd >= 3.3): ``success`` is applied, at the outer
    transaction's revision, only if ``compare`` holds as the outer one begins."""
    return {"request_txn": {"compare": list(compare), "success": list(success), "failure": []}}


def as_read(kv: KV) -> Op:
    """The key is still the one read: not rewritten, and not deleted (a key's
    revisions are never reused)."""
    return {"key": enc(kv.key), "target": "MOD", "result": "EQUAL", "mod_revision": str(kv.mod)}


def unchanged_since(key: str, revision: int, *, under: bool = False) -> Op:
    """The key (with ``under``: every key under the prefix ``key``) was last modified
    at or before ``revision``: nothing was created or changed there since. A deleted key
    passes, which is what the callers want (a deletion only ever frees something)."""
    compare = {
        "key": enc(key),
        "target": "MOD",
        "result": "LESS",
        "mod_revision": str(revision + 1),
    }
    if under:
        compare["range_end"] = enc(prefix_end(key))
    return compare


@dataclass(frozen=True)
class Txn:
    """What a transaction found."""

    succeeded: bool
    revision: int
    """The store's revision after it: the revision of its writes, if it wrote."""
    responses: tuple[Mapping[str, Any], ...]
    resent: bool
    """An earlier send of this call may have been applied (its answer was lost)."""
    term: int = 0
    """The raft term of the member that answered."""

    def kvs(self, i: int) -> list[KV]:
        """The keys read by the ``i``-th operation (a range)."""
        return [_kv(raw) for raw in self.responses[i].get("response_range", {}).get("kvs", ())]

    def took(self, i: int) -> bool:
        """Whether the ``i``-th operation, a `nested` transaction, applied its writes."""
        return bool(self.responses[i].get("response_txn", {}).get("succeeded"))

    def deleted(self, i: int) -> list[KV]:
        """The keys removed by the ``i``-th operation (a delete)."""
        found = self.responses[i].get("response_delete_range", {})
        return [_kv(raw) for raw in found.get("prev_kvs", ())]


def _maybe_applied(exc: Exception) -> bool:
    """Whether a request that failed may still be applied by the cluster: unless the
    member refused the connection (nothing was sent), it may. A connection reset after
    the request went out (a member killed under it), a timeout (a paused member), or
    etcd's 503 ("request timed out", "leader changed": the proposal was made) all leave
    a request that the cluster can apply, even later (README.md, "Writes that arrive late").
    etcd3gw raises its own exception inside its handler of the `requests` one, whose
    reason says what happened; an answer cut short comes as `requests`' own."""
    failure = exc if isinstance(exc, requests.exceptions.RequestException) else exc.__context__
    if not isinstance(failure, requests.exceptions.ConnectionError) or not failure.args:
        return True
    return not isinstance(getattr(failure.args[0], "reason", None), NewConnectionError)


def _said(exc: Exception) -> str:
    """What ``exc`` says, after a colon, for the end of a message; nothing if it says
    nothing (etcd3gw's own exceptions mostly carry no text: a message ended in ": ")."""
    text = str(exc).strip()
    return f": {text}" if text else ""


class _Member(Etcd3Client):
    """etcd3gw's client of one member, each request timed out as the calling thread says:
    `CALL_TIMEOUT`, or what is left of the call if that is less (`Cluster.post`)."""

    request_timeout = threading.local()

    @property
    def timeout(self) -> float:
        value: float = getattr(self.request_timeout, "value", CALL_TIMEOUT)
        return value

    @timeout.setter
    def timeout(self, value: object) -> None:
        """etcd3gw's constructor sets one for all requests: each takes the caller's."""


class Cluster:
    """The members of one etcd cluster, tried in turn."""

    def __init__(self, url: StoreURL, stats: Stats) -> None:
        self.url = url
        self.stats = stats
        self._members: list[Etcd3Client] = []
        for endpoint in url.target.split(","):
            host, _, port = endpoint.rpartition(":")
            self._members.append(_Member(host=host, port=int(port), api_path="/v3/"))
        self._first = 0  # the member that answered last: asked first next time
        self._pid = os.getpid()

    def post(self, path: str, body: Mapping[str, Any]) -> tuple[Any, bool]:
        """Send one request, trying the members in turn; return the answer and whether an
        earlier send may have been applied. `StoreError` once the call timeout is spent."""
        if os.getpid() != self._pid:  # a forked child: the store is its parent's
            raise process.forked_from(self._pid)
        began = time.monotonic()
        deadline = bounds.deadline(self.url.call_timeout)
        start = self._first
        tried = 0
        resent = False
        while True:
            index = (start + tried) % len(self._members)
            member = self._members[index]
            self.stats.add("statements")
            # A member that does not answer gets half of what is left, where there is
            # another to ask: a heartbeat's short bound must not all go to a member that
            # is paused or cut off from the others.
            left = deadline - time.monotonic()
            share = left / 2 if len(self._members) > 1 else left
            _Member.request_timeout.value = max(0.01, min(CALL_TIMEOUT, share))
            try:
                answer = member.post(member.get_url(path), json=body)
            except _RETRYABLE as exc:
                cause = exc
                resent = resent or _maybe_applied(exc)
                self._first = (index + 1) % len(self._members)  # the next call starts there
            except exceptions.Etcd3Exception as exc:
                raise StoreError(
                    f"lock store {self.url.display}: etcd refused {path}{_said(exc)}"
                ) from exc
            else:
                self._first = index
                return answer, resent
            tried += 1
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"lock store {self.url.display}: no member answered within "
                    f"{time.monotonic() - began:.1f} s (is a majority of the cluster up "
                    f"and reachable?){_said(cause)}"
                ) from cause
            self.stats.add("retries")
            if tried % len(self._members) == 0:  # every member failed: give an election a moment
                time.sleep(max(0.0, min(0.1, deadline - time.monotonic())))

    def txn(
        self,
        success: Sequence[Op],
        compare: Sequence[Op] = (),
        failure: Sequence[Op] = (),
    ) -> Txn:
        found, resent = self.post(
            "/kv/txn",
            {"compare": list(compare), "success": list(success), "failure": list(failure)},
        )
        return Txn(
            succeeded=bool(found.get("succeeded")),
            revision=int(found["header"]["revision"]),
            responses=tuple(found.get("responses", ())),
            resent=resent,
            term=int(found["header"].get("raft_term", 0)),
        )

    def read(self, ops: Iterable[Op]) -> Txn:
        """Several reads at one revision (a transaction with no condition)."""
        return self.txn(list(ops))

    def grant(self, ttl: int) -> int:
        found, _ = self.post("/lease/grant", {"TTL": ttl, "ID": 0})
        return int(found["ID"])

    def keep_alive(self, lease: int, key: str) -> bool:
        """Renew a lease, confirmed by a leader a quorum follows; False if the cluster has
        already expired (or revoked) it, or ``key``, attached to it, is gone.

        etcd renews a lease in its leader's memory without asking a quorum. A leader
        that is cut off, or paused and resumed before it learns of the term the
        others have moved on to, renews a lease and says so while the real leader,
        which never heard of it, lets it expire: a holder would act on a renewal
        that never counted (seen in the fault harness, a leader paused for 3 s). So
        a renewal counts only if a linearizable read (which needs a quorum behind a
        leader of its term) then finds ``key`` in the same raft term; otherwise the
        renewal is tried again (`StoreError`), and the lease ends on the holder's own
        clock if none is confirmed in time (`lease`).
        """
        found, _ = self.post("/lease/keepalive", {"ID": str(lease)})
        result = found.get("result", {})
        if int(result.get("TTL", 0)) <= 0:
            return False
        renewed_in = int(result.get("header", {}).get("raft_term", 0))
        seen = self.read([get(key)])
        if not seen.kvs(0):
            return False
        if seen.term != renewed_in:
            raise StoreError(
                f"lock store {self.url.display}: a lease renewal was answered in raft term "
                f"{renewed_in}, by a member that may no longer have been the leader (the "
                f"cluster is at term {seen.term}): it does not count"
            )
        return True

    def revoke(self, lease: int) -> None:
        """End a lease, deleting every key attached to it (an unknown lease is no error)."""
        try:
            self.post("/kv/lease/revoke", {"ID": str(lease)})
        except StoreError as exc:
            if "not found" not in str(exc).lower():
                raise

    def watch(
        self,
        prefix: str,
        on_event: Callable[[str, str, int, int], None],
        on_gap: Callable[[], None],
    ) -> Watch:
        return Watch(self._members, prefix, on_event, on_gap)

    def close(self) -> None:
        for member in self._members:
            member.session.close()


class Watch:
    """One stream of the changes under ``prefix``, kept open by a daemon thread.

    ``on_event(type, key, created, revision)`` gets every change ("PUT" or "DELETE";
    ``created``: the revision that created the key, 0 for a deletion; ``revision``: the
    change's), in order, a transaction's in the order of its operations; ``on_gap()`` is
    called when changes may have been missed (the history was compacted).
    """

    def __init__(
        self,
        members: Sequence[Etcd3Client],
        prefix: str,
        on_event: Callable[[str, str, int, int], None],
        on_gap: Callable[[], None],
    ) -> None:
        self._members = members
        self._prefix = prefix
        self._on_event = on_event
        self._on_gap = on_gap
        self._next: int | None = None  # the revision to resume from
        self._created = threading.Event()
        self._closed = False
        self._response: requests.Response | None = None
        self._thread = threading.Thread(target=self._run, name="lockwarden-etcd-watch", daemon=True)
        self._thread.start()

    def wait_created(self, timeout: float) -> bool:
        """Whether the stream is open (events after this moment will arrive)."""
        return self._created.wait(timeout)

    def _run(self) -> None:
        turn = 0
        while not self._closed:
            member = self._members[turn % len(self._members)]
            turn += 1
            try:
                self._stream(member)
            except Exception as exc:  # any break (reset, closed under us, garbage): resume
                if not self._closed:
                    hooks.logger(STORE_LOG).info(
                        "etcd watch on %s broke, resuming: %s", member.base_url, exc
                    )
            if not self._closed:
                time.sleep(0.05)

    def _stream(self, member: Etcd3Client) -> None:
        create: dict[str, Any] = {
            "key": enc(self._prefix),
            "range_end": enc(prefix_end(self._prefix)),
        }
        if self._next is not None:
            create["start_revision"] = str(self._next)
        # A silent member (paused, partitioned) must not hold the stream forever:
        # after a minute without a byte, resume on another member.
        response = member.session.post(
            member.get_url("/watch"),
            json={"create_request": create},
            stream=True,
            timeout=(CALL_TIMEOUT, 60.0),
        )
        self._response = response
        with response:
            for line in response.iter_lines():
                if not line.strip():
                    continue
                result = json.loads(line)["result"]
                header = int(result.get("header", {}).get("revision", 0))
                if result.get("compact_revision"):
                    self._next = None
                    self._on_gap()
                    return
                if result.get("created"):
                    if self._next is None:
                        self._next = header + 1
                    self._created.set()
                for event in result.get("events", ()):
                    kv = event["kv"]
                    revision = int(kv.get("mod_revision", 0))
                    self._next = max(self._next or 0, revision + 1)
                    created = int(kv.get("create_revision", 0))
                    self._on_event(event.get("type", "PUT"), dec(kv["key"]), created, revision)

    def close(self) -> None:
        self._closed = True
        response = self._response
        if response is not None:  # wake the thread blocked reading the stream
            with contextlib.suppress(Exception):
                sock = socket.fromfd(response.raw.fileno(), socket.AF_INET, socket.SOCK_STREAM)
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            response.close()
