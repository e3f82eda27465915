"""Fences: the check that makes fencing tokens protect something.

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

Given the lock itself (a `HeldLock`, or a `Stamp` holding a lock named like
the fence's resource) instead of its token, the fence does more: it refuses
at once, without asking the database, when the lock's session already knows
the lock is lost or released; and in the same statement as the token check
it checks that the lock's holder row is still there with that token and its
session live. A token alone guards only against older tokens: a holder whose
lock was broken or expired writes until a newer holder has used the fence,
and a token of another lock, or a mistaken huge one, shuts out the
resource's writers for good — until an administrator's `Store.reset_fence`.
"""

from __future__ import annotations

from typing import Protocol

from lockwarden.errors import LockLost, LockUsageError
from lockwarden.store import validate
from lockwarden.store.backends.base import Backend


class _Claim(Protocol):
    """What a lock shows a fence (`Stamp._fence_claim`)."""

    def _fence_claim(self, resource: str) -> tuple[str, str, int]:
        """(session id, request id, token) of the lock guarding ``resource``;
        `LockLost` if the session knows the lock is gone."""


Access = int | _Claim
"""A fencing token, or the lock (`HeldLock`, `Stamp`) that carries it."""


class Fence:
    """The fence of one protected resource. Get one from `Store.fence`."""

    def __init__(self, backend: Backend, resource: str) -> None:
        self._backend = backend
        self.resource = validate.name(resource, "fence resource")

    def admit(self, token: Access) -> None:
        """Record ``token`` as seen (older writers are refused from now on).

        `LockLost` if a newer token has already written.
        """
        self._advance(token, None, write=False)

    def read(self, token: Access) -> str | None:
        """Admit ``token`` and return the stored value (None if never written).

        Admitting on read matters: once a newer holder has read, an older
        holder's write is refused, so the newer holder's update is never lost.
        `LockLost` if a newer token has already written.
        """
        return self._advance(token, None, write=False)

    def write(self, token: Access, value: str | None) -> None:
        """Store ``value`` under ``token``, or raise `LockLost` if a newer token was admitted
        (or, given the lock, if the lock is no longer held)."""
        if value is not None:
            value = validate.text(value, "a fence value (text or None)")
        self._advance(token, value, write=True)

    def state(self) -> tuple[int, str | None]:
        """The highest token admitted (0 if none) and the value, without admitting anything."""
        rows = self._backend.fence_read(self.resource)
        return (rows[0]["token"], rows[0]["value"]) if rows else (0, None)

    def _advance(self, access: Access, value: str | None, *, write: bool) -> str | None:
        session = request = None
        if isinstance(access, int):
            token = validate.token(access)
        elif hasattr(access, "_fence_claim"):
            session, request, token = access._fence_claim(self.resource)
        else:
            raise LockUsageError(
                f"a fence takes a fencing token (an integer) or the lock that carries it "
                f"(a HeldLock or Stamp), got {access!r}"
            )
        rows = self._backend.fence_advance(
            resource=self.resource,
            token=token,
            value=value,
            write=write,
            session=session,
            request=request,
        )
        if rows:
            value_now: str | None = rows[0]["value"]
            return value_now
        what = "write" if write else "read"
        found = self._backend.fence_read(self.resource)
        newer = found and (found[0]["token"] if write else found[0]["written"]) > token
        if not newer:  # so the lock check failed
            raise LockLost(
                f"the lock behind token {token} is no longer held (released, broken, or its "
                f"session expired), so this {what} at fence {self.resource!r} is refused",
                name=self.resource,
                token=token,
            )
        seen = (
            f"already admitted token {found[0]['token']}"
            if write
            else f"taken a write with token {found[0]['written']}"
        )
        raise LockLost(
            f"fence {self.resource!r} has {seen}, newer than {token}: the lock behind "
            f"token {token} was taken over, so this {what} is refused",
            name=self.resource,
            token=token,
        )

    def __repr__(self) -> str:
        return f"Fence({self.resource!r})"
