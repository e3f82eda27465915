"""Wake-ups for waiters in this process (design note, "Waiting and wake-ups").

A waiter subscribes once its first attempt is blocked, to the names it waits
for and to its request id. A wake-up sets a flag that the next wait
consumes, so one that comes between an attempt and the wait is not lost:
the wait returns at once. One that comes between the first attempt and the
subscription is not lost either: the wake-ups of the last seconds are
remembered (`Wakeups.add` replays those that came after the attempt began),
and if the source of wake-ups restarted meanwhile (`Wakeups.epoch`), the
waiter looks again at once.

Two kinds of wake-up: a **name**'s waiters are told to attempt again (a
reclaim, a break, a change of permits); one **request** is told that it was
granted (with its tokens), or to attempt again. Where they come from is the
backend's business: PostgreSQL's LISTEN connection, SQLite's in-process
releases and its ``data_version`` poller.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

Tokens = tuple[int, ...]
"""The tokens of a grant made to a waiting request, in the order of its names."""

Woken = Tokens | bool
"""What ended a wait: the tokens of a grant made to the request meanwhile; True for
any other wake-up (look again); False if the time ran out with nothing heard."""

REMEMBER = 10.0
"""Seconds a wake-up nobody was subscribed to is kept for a waiter about to subscribe."""

_KEEP = 4096
"""How many remembered wake-ups are kept before the old ones are dropped."""


Told = tuple[str, str, Tokens | None]
"""Whom a release tells after its commit: (request id, session id, tokens granted to
it — one name's; None for a multi-lock, or for a request that must attempt again)."""


def message(request_id: str, tokens: Tokens | None) -> str:
    """What tells a request of another process what a release did: ``"<request id>
    <token>"`` (granted that token) or the request id alone (attempt again). PostgreSQL's
    functions write the same for NOTIFY (`plpgsql`); `read` reads either."""
    return f"{request_id} {tokens[0]}" if tokens else request_id


def read(message: str) -> tuple[str, Tokens | None]:
    """The request id and the tokens (None: attempt again) of a `message`. Anyone who can
    reach a source may send one: what is not of this form is at most a look again."""
    request_id, _, token = message.partition(" ")
    return request_id, (int(token),) if token.isascii() and token.isdigit() else None


class Subscription:
    """One waiter's interest in some names and in its request, waited on from a thread."""

    def __init__(self, names: frozenset[str], request_id: str = "") -> None:
        self.names = names
        self.request_id = request_id
        self._tokens: Tokens | None = None
        self._event = threading.Event()

    def notify(self) -> None:
        self._event.set()

    def grant(self, tokens: Tokens) -> None:
        """The request was granted these tokens (by someone else's release)."""
        self._tokens = tokens
        self.notify()

    def heard(self, message: str) -> None:
        """A `message` the waiter read itself, from its mailbox (`inbox`): its grant if it
        is for this request and carries tokens, else at most a look again. Only the flag
        is set: the waiter is awake already."""
        request_id, tokens = read(message)
        if tokens and request_id == self.request_id:
            self._tokens = tokens
        self._event.set()

    def wait(self, timeout: float | None) -> Woken:
        """Return when woken (or at once if woken since the last wait), or after ``timeout``;
        say which (`Woken`)."""
        self._event.wait(timeout)
        return self._woken()

    def close(self) -> None:
        """Let go of what the subscription holds once nobody waits on it (a mailbox:
        `inbox.MailboxSubscription`)."""

    def _woken(self) -> Woken:
        # Cleared only if seen set: a wake-up that lands after the look stays for the
        # next wait, which then ends at once (a waiter told "nothing heard" waits on
        # without asking the database, so no wake-up may be wiped unseen).
        woken = self._event.is_set()
        if woken:
            self._event.clear()
        tokens = self._take()
        return tokens if tokens else woken

    def _take(self) -> Tokens | None:
        tokens, self._tokens = self._tokens, None
        return tokens


class _Recent:
    """Wake-ups of the last `REMEMBER` seconds, by key: when each came (and what it carried)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, Tokens | None]] = {}
        self._limit = _KEEP

    def put(self, key: str, tokens: Tokens | None = None) -> None:
        self._seen[key] = (time.monotonic(), tokens)
        if len(self._seen) > self._limit:
            old = time.monotonic() - REMEMBER
            self._seen = {k: v for k, v in self._seen.items() if v[0] >= old}
            self._limit = max(_KEEP, 2 * len(self._seen))

    def since(self, key: str, moment: float) -> tuple[float, Tokens | None] | None:
        found = self._seen.get(key)
        return found if found is not None and found[0] >= moment else None

    def pop(self, key: str) -> None:
        self._seen.pop(key, None)


class Wakeups:
    """Who in this process waits for which names and requests."""

    def __init__(self, watch: Callable[[float | None], None]) -> None:
        self._watch = watch
        self._lock = threading.Lock()
        self._by_name: dict[str, set[Subscription]] = {}
        self._by_request: dict[str, Subscription] = {}
        self._names = _Recent()
        self._requests = _Recent()
        self._subs: set[Subscription] = set()
        self._watched = False
        self._adding = 0
        """How many `add` calls are under way: the source may not stop meanwhile (`unwatch`)."""
        self._left_at = -math.inf
        """When the last subscription was removed (`time.monotonic`)."""
        self.epoch = 0
        """Moves whenever wake-ups may have been missed (`wake_all`): a waiter that read it
        before its first attempt and finds it moved when subscribing looks again at once."""

    def add(
        self,
        sub: Subscription,
        since: float = math.inf,
        epoch: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Register ``sub``; deliver what came for it since ``since`` (a `time.monotonic`).

        The backend's source of wake-ups from other processes is running
        before this returns, or ``timeout`` seconds have passed (None: no limit):
        the subscriber's time left, after which it waits no more (`Backend._watch`).
        ``epoch``, read before the attempt that made the subscriber wait: if
        wake-ups may have been missed since, it is woken.
        """
        with self._lock:
            self._adding += 1
            first = not self._watched
        try:
            self._watch(timeout)
        except BaseException:
            with self._lock:
                self._adding -= 1
            raise
        with self._lock:
            self._adding -= 1
            if first:  # nothing from other processes was heard before the source started
                self._watched = True
                self.epoch += 1
            self._subs.add(sub)
            for name in sub.names:
                self._by_name.setdefault(name, set()).add(sub)
                if self._names.since(name, since) is not None:
                    sub.notify()
            if sub.request_id:
                self._by_request[sub.request_id] = sub
                found = self._requests.since(sub.request_id, since)
                if found is not None:
                    self._requests.pop(sub.request_id)
                    self._deliver(sub, found[1])
            if epoch is not None and epoch != self.epoch:
                sub.notify()

    def remove(self, sub: Subscription) -> None:
        """Unregister ``sub`` (nothing happens if it is not registered, or only partly:
        an exception from a signal's handler may have cut `add` short)."""
        with self._lock:
            if sub not in self._subs:
                return
            self._subs.discard(sub)
            for name in sub.names:
                subs = self._by_name.get(name)
                if subs is None:
                    continue
                subs.discard(sub)
                if not subs:
                    del self._by_name[name]
            if self._by_request.get(sub.request_id) is sub:
                del self._by_request[sub.request_id]
            self._left_at = time.monotonic()

    def unwatch(self, idle: float, stop: Callable[[], None]) -> bool:
        """Call ``stop`` if nobody has waited for ``idle`` seconds, and say whether it ran.

        ``stop`` (run under this object's lock) must leave the backend so that its
        next ``watch`` starts the source again. Nobody is subscribed, and no `add`
        is under way: an `add` that starts the source and then subscribes is never
        cut in two by a stop, which would leave its waiter unheard. The next
        subscriber finds the source not started, so it looks again at once, as the
        first subscriber of the store does: what came while nobody listened is lost.
        """
        with self._lock:
            if self._subs or self._adding or time.monotonic() - self._left_at < idle:
                return False
            self._watched = False
            stop()
            return True

    @property
    def waiting(self) -> int:
        """How many subscriptions are open."""
        return len(self._subs)

    def wake(self, names: Iterable[str]) -> None:
        """Tell the waiters of ``names`` to attempt again."""
        with self._lock:
            subs: set[Subscription] = set()
            for name in names:
                self._names.put(name)
                subs.update(self._by_name.get(name, ()))
        for sub in subs:
            sub.notify()

    def address(self, request_id: str, tokens: Tokens | None) -> None:
        """Tell one request that it was granted ``tokens`` (None: to attempt again)."""
        with self._lock:
            sub = self._by_request.get(request_id)
            if sub is None:
                self._requests.put(request_id, tokens)
                return
        self._deliver(sub, tokens)

    def deliver(self, message: str) -> None:
        """A message from another process for one request: ``"<request id> <token>"``
        (granted that token), or the request id alone (attempt again).

        Anyone who can reach the source may send one: a message not of this form
        only makes the request (if there is one) look again (`read`). Its id is the
        128-bit secret that also authorizes the release.
        """
        self.address(*read(message))

    @staticmethod
    def _deliver(sub: Subscription, tokens: Tokens | None) -> None:
        if tokens:
            sub.grant(tokens)
        else:
            sub.notify()

    def wake_all(self) -> None:
        """Tell every waiter to attempt again: wake-ups may have been missed."""
        with self._lock:
            self.epoch += 1
            subs = set(self._subs)
        for sub in subs:
            sub.notify()
