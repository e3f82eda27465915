"""The calm path of a release, for the SQL backends that take it (PostgreSQL, MySQL).

Most releases free a name nobody waits for. Where a name has not lately been
fought over (`FoughtOver`), the release first tries the one statement that frees
it only if nobody waits (`queries.RELEASE_IDLE`, under the name's lock: a waiter
queueing meanwhile is seen); otherwise, or if that finds a waiter, the full
release grants the names on (design note, "Release").

Either may be sent again after its connection dropped, and a resent release
finds nothing when the first one committed. It cannot tell that from a lock
lost meanwhile, and the first is by far the likelier, so it counts as released.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from lockwarden.store.backends.base import FoughtOver


class CalmRelease(ABC):
    """`release` as the calm path and the full release, which a backend provides."""

    _contended: FoughtOver

    def release(self, session_id: str, request_id: str, names: Sequence[str]) -> int:
        """`Backend.release`: how many holder rows were deleted (or, resent, all of them)."""
        resent = False
        if len(names) == 1 and names[0] not in self._contended:
            released, resent = self._release_idle(session_id, request_id, names[0])
            if released:
                return 1
            # Someone waits (or the lock was lost): as after a release that lets
            # someone in, the name counts as fought over.
            self._contended.note(names, True)
        deleted, sent = self._release_contended(session_id, request_id, names)
        return len(names) if (sent > 1 or resent) and deleted == 0 else deleted

    @abstractmethod
    def _release_idle(self, session_id: str, request_id: str, name: str) -> tuple[bool, bool]:
        """`queries.RELEASE_IDLE` under the name's lock: whether it released the name, and
        whether it was sent more than once. If it did not release it (someone waits,
        nothing was held, or a first sending committed), nothing changed."""

    @abstractmethod
    def _release_contended(
        self, session_id: str, request_id: str, names: Sequence[str]
    ) -> tuple[int, int]:
        """The full release, granting the names on: the holder rows deleted, and how many
        times it was sent."""
