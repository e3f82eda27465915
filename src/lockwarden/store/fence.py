"""Fences: the check that makes fencing tokens protect something (D7).

A lock alone cannot stop a holder that was paused past its lease from
writing after the next holder started. A fence can: it lives beside the
protected resource (here, in the store's database), remembers the highest
token it has admitted and the token of the last write, and atomically
refuses what an older token may no longer do. Its value slot makes it a
fenced register:

- ``write(token, value)`` needs a token at least as new as every token
  admitted: once a newer holder has come by, an older one writes nothing;
- ``read(token)`` (and ``admit``) needs a token at least as new as the last
  write's, and admits it: an older holder never reads over a newer
  holder's write, and after this read it cannot write either.

So a read-modify-write under a write lock is safe even against a holder
that lost the lock without knowing, and readers sharing a read lock, whose
tokens arrive in any order, are all admitted (a newer reader does not make
an older one's read stale: only a write does).
"""

from __future__ import annotations

from lockwarden.errors import LockLost, LockUsageError
from lockwarden.store import queries, validate
from lockwarden.store.backend import Backend


class Fence:
    """The fence of one protected resource. Get one from `Store.fence`."""

    def __init__(self, backend: Backend, resource: str) -> None:
        self._backend = backend
        self.resource = validate.name(resource, "fence resource")

    def admit(self, token: int) -> None:
        """Record ``token`` as seen (older writers are refused from now on).

        `LockLost` if a newer token has already written.
        """
        self._advance(token, None, write=False)

    def read(self, token: int) -> str | None:
        """Admit ``token`` and return the stored value (None if never written).

        Admitting on read matters: once a newer holder has read, an older
        holder's write is refused, so the newer holder's update is never lost.
        `LockLost` if a newer token has already written.
        """
        return self._advance(token, None, write=False)

    def write(self, token: int, value: str | None) -> None:
        """Store ``value`` under ``token``, or raise `LockLost` if a newer token was admitted."""
        if value is not None and not isinstance(value, str):
            raise LockUsageError(f"a fence holds text (or None), got {type(value).__name__}")
        self._advance(token, value, write=True)

    def state(self) -> tuple[int, str | None]:
        """The highest token admitted (0 if none) and the value, without admitting anything."""
        rows = self._backend.query(queries.FENCE_READ, {"resource": self.resource})
        return (rows[0]["token"], rows[0]["value"]) if rows else (0, None)

    def _advance(self, token: int, value: str | None, *, write: bool) -> str | None:
        token = validate.token(token)
        rows = self._backend.query(
            queries.FENCE_ADVANCE,
            {"resource": self.resource, "token": token, "value": value, "write": write},
            write=True,
        )
        if not rows:
            found = self._backend.query(queries.FENCE_READ, {"resource": self.resource})[0]
            seen = (
                f"already admitted token {found['token']}"
                if write
                else f"taken a write with token {found['written']}"
            )
            raise LockLost(
                f"fence {self.resource!r} has {seen}, newer than {token}: the lock behind "
                f"token {token} was taken over, so this {'write' if write else 'read'} is refused",
                name=self.resource,
                token=token,
            )
        value_now: str | None = rows[0]["value"]
        return value_now

    def __repr__(self) -> str:
        return f"Fence({self.resource!r})"
