"""The SQLite backend: the acquire algorithm in Python, under ``BEGIN IMMEDIATE``.

SQLite has one writer at a time, so a write transaction serializes every
request on the store (the role PostgreSQL's per-name advisory locks play).
The algorithm is the design note's, step for step, with the same shared
statements the PL/pgSQL function runs. The file is in WAL mode with
``synchronous=FULL``: a grant is on disk before the caller learns of it
(with ``durability="relaxed"``, grants and releases use connections with
``synchronous=NORMAL``: design note, "Durability").

Wake-ups: a change made through this store wakes its waiters at once; a
change in another process that may let a waiter in pokes the inbox of the
waiter's store (a datagram socket named by the tag its session ids end
with). Under the pokes, a poller reads ``PRAGMA data_version`` (which moves
whenever another connection commits) while someone waits, and after a
change wakes every waiter, at most every `SAFETY_NET`, in case a poke was lost.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import socket
import sqlite3
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext, suppress
from functools import partial
from typing import Any, TypeVar

from lockwarden.errors import LockUsageError, StoreError
from lockwarden.store import bounds, inbox, process
from lockwarden.store.backends.base import (
    AcquireRequest,
    Attempt,
    FoughtOver,
    Opening,
    Params,
    Pool,
    Row,
    Run,
)
from lockwarden.store.backends.sql import queries, schema
from lockwarden.store.backends.sql.algorithm import Engine, attempt, grant
from lockwarden.store.backends.sql.base import SQLBackend
from lockwarden.store.url import StoreURL
from lockwarden.store.wakeups import Told

T = TypeVar("T")

POLL_MIN, POLL_MAX = 0.002, 0.05
"""The cross-process poll interval: short after a change, doubling to the maximum while idle."""

SAFETY_NET = 0.1
"""Seconds between two wake-ups of every waiter by the poller, where pokes reach this store.

Every change that may let a waiter in pokes it (a release, a reclaim, a refusal, a
closed session, an administrator's override), so a change seen by the poller only
matters if a poke was lost: it is answered at most this often, never dropped."""

_TOKEN_TRIGGER = (
    "CREATE TRIGGER IF NOT EXISTS lw_holders_token AFTER INSERT ON lw_holders BEGIN"
    " UPDATE lw_meta SET value = NEW.token WHERE key = 'token' AND value < NEW.token;"
    " END"
)
"""A grant takes its token from the counter (`queries.SQLITE`), and this moves the
counter up to it in the same statement: an uncontended acquire is one INSERT. A
token is the counter plus its row number, the counter never goes down, so tokens
strictly increase, whether SQLite reads the counter once per statement or per row."""

_STEPS = {
    1: ["INSERT INTO lw_meta (key, value) VALUES ('token', 0), ('seq', 0)"],
    5: [_TOKEN_TRIGGER],
    # lw_holders without a rowid: its key is the table, one b-tree fewer to write per
    # grant and per release. SQLite changes that only by building the table again;
    # dropping the old one drops its index and trigger, made again on the new one.
    8: [
        schema.HOLDERS.replace("{p}lw_holders", "lw_holders_v8") + " WITHOUT ROWID",
        "INSERT INTO lw_holders_v8 (request_id, name, mode, session_id, token, granted_at)"
        " SELECT request_id, name, mode, session_id, token, granted_at FROM lw_holders",
        "DROP TABLE lw_holders",
        "ALTER TABLE lw_holders_v8 RENAME TO lw_holders",
        schema.HOLDERS_OWNER,
        _TOKEN_TRIGGER,
    ],
}

_TAKE_IDLE = queries.SQLITE.render(queries.TAKE_IDLE)

_QUEUE_BLOCKED = f"""
INSERT INTO lw_waiters (request_id, name, mode, session_id, seq, enqueued_at, expires_at)
SELECT :request, :name, :mode, :session, (SELECT value + 1 FROM lw_meta WHERE key = 'seq'),
       {{now}}, {{now}} + :wait
WHERE {queries.BLOCKED_BY_LIVE}
RETURNING seq
"""
"""The common wait on a name fought over, as PostgreSQL's `lw_lock` and MySQL's
`mysql.backend._taking` hold it (design note, "Acquire", the second shortcut): a write request
certainly blocked by a live holder, with nothing else at stake, is queued with the next
seq, and nothing else is read; no row otherwise, and the full attempt decides in the same
transaction. `_SEQ_TAKEN` then moves the counter on."""

_SEQ_TAKEN = "UPDATE lw_meta SET value = :seq WHERE key = 'seq'"

_MOVE_SEQ = "UPDATE {p}lw_meta SET value = value + 1 WHERE key = 'seq'"
"""A write that is sure to change a page (`SQLiteBackend._make_durable`)."""

_RELEASE = queries.RELEASE.rstrip() + f", {queries.QUEUED_FOR_HOLDER} AS queued"
"""`queries.RELEASE`, saying also whether anyone waits for each name: a release nobody
waits for is one statement."""

_RELEASE_IDLE = queries.SQLITE.render(queries.RELEASE_IDLE)
"""`queries.RELEASE_IDLE` in a transaction of its own, else `_RELEASE`'s transaction
decides. The name is compared, not looked up in a JSON list: ``json_each`` cost about 8 µs
of a relaxed pair's 100."""

_RESERVE = (
    "UPDATE lw_meta SET value = value + :n WHERE key = :key RETURNING value - :n + 1 AS first"
)
_HAS_META = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lw_meta'"


def _reserve(run: Run, counter: str, n: int) -> int:
    if counter == "token":  # read from the counter by the insert itself (`_STEPS`)
        return 0
    first: int = run(_RESERVE, {"key": counter, "n": n})[0]["first"]
    return first


_ENGINE = Engine(reserve=_reserve)


def _one(request: AcquireRequest) -> Params:
    """The parameters of a single-name request's one-statement steps."""
    return {
        "session": request.session_id,
        "request": request.request_id,
        "name": request.names[0],
        "mode": request.modes[0],
        "wait": request.wait,
    }


_NEW_BOOT = (
    "INSERT INTO lw_meta (key, value) VALUES ('boot', :boot)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value WHERE value <> excluded.value"
    " RETURNING value"
)
_TOKENS_MOVE_ON = (
    "UPDATE lw_meta SET value = ((value >> 40) + 1) << 40 WHERE key = 'token' AND value > 0"
)


def _note_boot(run: Run) -> None:
    """On the first opening of the store since this machine started, move the tokens on
    to the next 2^40 range, in the opening's durable transaction.

    A relaxed commit (``synchronous = NORMAL``) that a power loss forgets may
    have handed out tokens the counter no longer remembers; every process that
    could have used them died with the machine. Every token issued after the
    restart is larger than every token issued before it, remembered or not
    (design note, "Durability"). A process that is merely killed forgets
    nothing: the WAL is in the operating system's cache.
    """
    boot = process.boot()
    if boot is not None and run(_NEW_BOOT, {"boot": boot}):
        run(_TOKENS_MOVE_ON)


class _Turn:
    """A thread's place in a `_FairLock`'s queue."""

    __slots__ = ("gate", "given")

    def __init__(self) -> None:
        self.gate = threading.Lock()
        self.gate.acquire()  # the waiter blocks on it until the holder releases it
        self.given = False
        """Set (under the mutex) by the holder that hands the lock over to this turn."""


class _FairLock:
    """A lock granted in arrival order, around this store's write transactions.

    SQLite's busy handler polls with growing sleeps; a thread writing back
    to back would keep winning, and a heartbeat waiting behind it could miss
    its TTL. Ownership passes straight to the longest waiter instead.
    (Writers in other processes still meet SQLite's polling.)

    An exception raised by a signal's handler (Ctrl-C) can come at any call,
    even while the lock is being handed to this thread; whatever this thread
    owns by then is passed on, and a turn still queued leaves the queue.
    Otherwise the lock would pass to a thread no longer waiting, and every
    writer of the process would wait for ever.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queue: deque[_Turn] = deque()
        self._held = False

    def acquire(self, timeout: float) -> bool:
        """Take the lock in turn; False if ``timeout`` seconds pass first (the turn is
        then given up)."""
        turn: _Turn | None = None
        mine = False
        try:
            with self._mutex:
                if not self._held:
                    self._held = mine = True
                    return True
                turn = _Turn()
                self._queue.append(turn)
            if turn.gate.acquire(timeout=max(0.0, min(timeout, threading.TIMEOUT_MAX))):
                return True  # released by the holder handing over
            with self._mutex:
                if turn in self._queue:
                    self._queue.remove(turn)
                    return False
            return True  # handed over as the wait ended: ours after all (`turn.given`)
        except BaseException:
            with self._mutex:
                if turn is not None and turn in self._queue:
                    self._queue.remove(turn)
                elif mine or (turn is not None and turn.given):
                    self._pass_on()
            raise

    def __enter__(self) -> None:
        self.acquire(threading.TIMEOUT_MAX)

    def __exit__(self, *exc: object) -> None:
        with self._mutex:
            self._pass_on()

    def _pass_on(self) -> None:
        """Hand the lock to the longest waiter, or free it (the mutex held)."""
        if self._queue:
            turn = self._queue.popleft()
            turn.given = True
            turn.gate.release()
        else:
            self._held = False


class _FileWait:
    """Waits for an exclusive ``flock`` in a thread of its own, so that a caller can give up.

    A blocking ``flock`` cannot be cut short from another thread, and a process
    paused while it holds the lock (SIGSTOP inside a write) would hold the call
    that waits for it for as long as it stays paused. So the caller that does not
    get the lock at once hands the wait to this thread and waits for it no
    longer than its call may take (`bounds`); the thread, once granted, hands
    the lock to whoever still wants it, or lets it go. The descriptor is the
    writer's; the lock belongs to the open file, so whichever thread took it,
    the caller's unlock releases it.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._cond = threading.Condition(threading.Lock())
        self._wanted = False
        """A caller waits for the lock."""
        self._got = False
        """The thread took the lock for the caller, who has not picked it up yet."""
        self._blocked = False
        """The thread is inside ``flock``: the descriptor must stay open until it returns."""
        self._closed = False
        self._thread: threading.Thread | None = None

    def acquire(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the lock; True once it is the caller's."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lockwarden-sqlite-writer", daemon=True
                )
                self._thread.start()
            self._wanted = True
            self._cond.notify_all()
            try:
                got = self._cond.wait_for(lambda: self._got, max(0.0, timeout))
            except BaseException:  # a signal's handler raised: take nothing with us
                if self._got:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise
            finally:
                self._wanted = self._got = False
            return got

    def _run(self) -> None:
        while True:
            with self._cond:
                # Not while the lock handed over last time waits to be picked up.
                self._cond.wait_for(lambda: (self._wanted and not self._got) or self._closed)
                if self._closed:
                    return
                self._blocked = True
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            with self._cond:
                if self._wanted and not self._closed:
                    self._blocked = False
                    self._got = True
                    self._cond.notify_all()
                    continue
                # The caller gave up meanwhile. Still `_blocked` until the descriptor is
                # let go: a `close` now would have the caller close it under this call.
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                self._blocked = False
                if self._closed:
                    os.close(self._fd)  # left to this thread by `close`
                    return

    def close(self) -> bool:
        """Stop the thread; whether the caller may close the descriptor now (False: the
        thread is still waiting in ``flock`` on it, and closes it when that returns)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            return not self._blocked


class _Writer:
    """The right to write, across the processes of a store: a `_FairLock` inside this
    process, then an exclusive ``flock`` on a file beside the database.

    SQLite's own busy handler sleeps 1, 2, 5 ... 100 ms between tries, so a process
    whose write transactions follow each other closely (release, then lock again)
    kept the write lock, and the others could not even queue: four processes looping
    on one lock got 3-77 % of the grants. A process blocked in ``flock`` is woken by
    the kernel the moment the lock is free. The cost: a writer paused inside its
    transaction holds the others until it resumes, no longer than their call timeout
    (`_FileWait`: then `StoreError`, naming that process); a process that dies lets go
    at once.
    """

    def __init__(self, url: StoreURL) -> None:
        self._url = url
        self._fair = _FairLock()
        self._path = url.target + "-writer"
        self._fd = _open_beside(url.target, self._path)
        self._wait = _FileWait(self._fd)

    def __enter__(self) -> None:
        start = time.monotonic()
        end = bounds.deadline(self._url.call_timeout)
        if not self._fair.acquire(end - start):
            raise self._busy(start)
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not self._wait.acquire(end - time.monotonic()):
                    raise self._busy(start) from None
        except BaseException:
            self._fair.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:  # even if a signal's handler raised as the call returned
            self._fair.__exit__()

    def _busy(self, start: float) -> StoreError:
        holder = _flock_holder(self._fd)
        who = "another process" if holder is None else f"process {holder}"
        return StoreError(
            f"lock store {self._url.display}: {who} holds the store's write lock "
            f"({self._path}) and did not let go within {time.monotonic() - start:.1f} s: "
            "is it paused or stuck inside a write?"
        )

    def close(self) -> None:
        if self._wait.close():
            os.close(self._fd)


def _flock_holder(fd: int) -> int | None:
    """The pid that holds a ``flock`` on ``fd``'s file, as ``/proc/locks`` says (Linux)."""
    info = os.fstat(fd)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode:
                    return int(fields[4])
    except (OSError, ValueError):
        pass
    return None


def _bind(key: str, value: object) -> object:
    """Lists travel as JSON text, read by json_each; a request's modes as one letter per
    name, read by position (`queries.SQLITE`: two json_each tables cannot be joined fast)."""
    if not isinstance(value, list | tuple):
        return value
    return "".join(value) if key == "modes" else json.dumps(value)


def _use_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Put the store's file in WAL mode (kept in the file: after the first time, a no-op).

    The switch needs the file to itself, and SQLite returns 'database is
    locked' at once rather than run the busy handler for it: processes that
    open a new store together would fail. Each tries again instead, within
    ``timeout`` seconds (the call timeout), until one has switched the file.
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX)


def _create(url: StoreURL) -> None:
    """Create the store's file, if missing, as any program creates a file: mode 0666
    less the umask, the group the directory gives (its own, if it is setgid).

    SQLite gives the -wal and -shm files the database file's mode, and so does
    `_open_beside` the -writer file: the mode of the database file decides who
    may use the store. The command line's default store is private: it creates
    the file 0600 before connecting (`cli.common.open_store`). A file that
    cannot be created raises `StoreError` saying which right is missing (`_denied`).
    """
    with suppress(FileExistsError):
        os.close(os.open(url.target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o666))


def _open_beside(database: str, path: str) -> int:
    """Open ``path``, a file beside ``database``, creating it if missing, as SQLite opens
    its -wal and -shm files: a new one gets the database file's mode (umask or not) and,
    made by root, its owner; its group too, where this process may give it.

    A file the process can read but not write is opened read-only: ``flock``, all the
    -writer file is for, needs no more. Without a database file (yet), the new file
    gets 0666 less the umask.
    """
    try:
        info: os.stat_result | None = os.stat(database)
    except FileNotFoundError:
        info = None
    mode = 0o666 if info is None else stat.S_IMODE(info.st_mode) & 0o666
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    if info is not None:
        made = os.fstat(fd)
        with suppress(OSError):  # the umask took bits away: the database file's mode wins
            if stat.S_IMODE(made.st_mode) != mode:
                os.fchmod(fd, mode)
        root = os.geteuid() == 0
        if made.st_gid != info.st_gid or (root and made.st_uid != info.st_uid):
            with suppress(OSError):  # not a group of this user's: the directory's stays
                os.fchown(fd, info.st_uid if root else -1, info.st_gid)
    return fd


_DENIED = frozenset(
    {sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_IOERR}
)
"""SQLite's primary result codes of a file it may not open or write."""

_SHARING = 'docs/operators.md, "A store shared by several users of one host"'


def _denied(url: StoreURL, exc: BaseException) -> StoreError | None:
    """The error for ``exc``, met while opening the store, if a right on one of the
    store's files (or their directory) is missing: which file, which right, what to do.
    None if every right is there (the failure is something else)."""
    if isinstance(exc, OSError):
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
            return None
    else:
        cause = exc.__cause__
        if not isinstance(cause, sqlite3.Error):
            return None
        if getattr(cause, "sqlite_errorcode", 0) & 0xFF not in _DENIED:
            return None
    problem = _access_problem(url.target)
    if problem is None:
        return None
    return StoreError(f"lock store {url.display}: {problem}")


def _access_problem(database: str) -> str | None:
    """What keeps this process from reading and writing the store's files, in words.

    Every command writes to the store (opening it checks the schema in a write
    transaction), and SQLite makes its -wal and -shm files beside the
    database when it opens it, so this process needs: to enter the directory
    (and to create files in it, for any of them missing), to read and write
    the database, -wal and -shm files, and to read the -writer file.
    """
    directory = os.path.dirname(database) or "."
    if not os.path.isdir(directory):
        return f"the directory {directory} does not exist: create it, or give another path"
    with suppress(OSError):
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return (
                f"{database} is on a read-only file system: every command writes to the "
                "store (status too: opening a store checks its schema in a write "
                "transaction); mount it read-write, or use a store on writable storage"
            )
    if not _can(directory, os.X_OK):
        return (
            f"no permission to enter the directory {directory} ({_owner(directory)}): "
            f"its owner can grant search (x) permission ({_SHARING})"
        )
    for path, rights, what in (
        (database, os.R_OK | os.W_OK, "the database file"),
        (database + "-wal", os.R_OK | os.W_OK, "SQLite's write-ahead log"),
        (database + "-shm", os.R_OK | os.W_OK, "SQLite's shared-memory index"),
        (database + "-writer", os.R_OK, "the writers' lock file"),
    ):
        if not os.path.lexists(path):
            if not _can(directory, os.W_OK):
                return (
                    f"cannot create {path} ({what}): no permission to create files in "
                    f"{directory} ({_owner(directory)}); its owner can grant write "
                    f"permission on it, or give a path in a directory you can write ({_SHARING})"
                )
            continue
        missing = [
            word
            for right, word in ((os.R_OK, "read"), (os.W_OK, "write"))
            if rights & right
            if not _can(path, right)
        ]
        if missing:
            return (
                f"no {' or '.join(missing)} permission on {path} ({what}; {_owner(path)}): "
                f"its owner can grant it, to you or to a group you are in ({_SHARING})"
            )
    return None


def _can(path: str, right: int) -> bool:
    """Whether this process (its effective user and groups) has ``right`` on ``path``."""
    return os.access(path, right, effective_ids=os.access in os.supports_effective_ids)


def _owner(path: str) -> str:
    """Who may do what with ``path``, for a message: "owner alice, group ops, mode 0640"."""
    import grp  # noqa: PLC0415  (only for this message)
    import pwd  # noqa: PLC0415

    try:
        info = os.stat(path)
    except OSError:
        return "not readable"
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    return f"owner {owner}, group {group}, mode {stat.S_IMODE(info.st_mode):04o}"


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Row:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


class SQLiteBackend(SQLBackend):
    dialect = queries.SQLITE

    def __init__(
        self, url: StoreURL, *, relaxed: bool = False, opening: Opening = "create"
    ) -> None:
        super().__init__(url)
        if relaxed and process.boot() is None:
            raise LockUsageError(
                f"lock store {url.display}: relaxed durability needs to know when this "
                "machine restarted (Linux's boot id), so that fencing tokens never repeat "
                "after a power loss, and this system does not say: use the default "
                'durability="durable"'
            )
        if opening != "create" and not os.path.isfile(url.target):
            # Before anything is opened: that would create the file and its lock file.
            raise self._no_store(_STEPS)
        self.relaxed = relaxed
        self._pool: Pool[sqlite3.Connection] = Pool(
            partial(self._connect, "FULL"), sqlite3.Connection.close
        )
        self._relaxed_pool: Pool[sqlite3.Connection] = Pool(
            partial(self._connect, "NORMAL"), sqlite3.Connection.close
        )
        """Connections whose commits do not wait for the disk (design note, "Durability")."""
        try:
            if opening == "create":
                _create(url)
            self._run(lambda conn: None)  # SQLite says first if the database cannot be opened
            self._writing = _Writer(url)
        except (OSError, StoreError) as exc:
            denied = _denied(url, exc)
            if denied is not None:
                raise denied from exc
            if isinstance(exc, OSError):
                raise StoreError(f"lock store {url.display}: {exc}") from exc
            raise
        self._closed = threading.Event()
        self._kicks = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for end in self._kicks:
            end.setblocking(False)
        self.pokes = inbox.reachable()
        self._outbox = inbox.Outbox()
        self._listener = self._listener_of(self._poll, "lockwarden-sqlite-poll")
        self._contended = FoughtOver()
        """Names to acquire without trying `TAKE_IDLE` first: it takes the write lock only
        to find a name fought over taken, and the full attempt then takes it again (under
        4 processes on one lock that cost 15-30% of the acquisitions per second). A request
        for one of them that would wait tries `_QUEUE_BLOCKED` first instead."""
        self._migrate((), _STEPS, opening, _note_boot)

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.url.target,
            timeout=self.url.call_timeout,  # SQLite's busy handler: for writers without `_Writer`
            isolation_level=None,
            check_same_thread=False,
        )
        conn.row_factory = _dict_row
        _use_wal(conn, self.url.call_timeout)
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        return conn

    def _has_store(self) -> bool:
        return bool(self.query(_HAS_META))  # the file exists: checked before opening it

    # -- running statements ----------------------------------------------------------

    def _run(self, work: Callable[[sqlite3.Connection], T], *, durable: bool = True) -> T:
        try:
            return (self._pool if durable else self._relaxed_pool).run(work)
        except sqlite3.Error as exc:
            raise StoreError(f"lock store {self.url.display}: {exc}") from exc

    def _execute(self, conn: sqlite3.Connection, sql: str, params: Params | None) -> list[Row]:
        self.stats.add("statements")
        bound = {k: _bind(k, v) for k, v in (params or {}).items()}
        return conn.execute(self.dialect.render(sql), bound).fetchall()

    def _in_transaction(
        self, work: Callable[[Run], T], *, write: bool = True, durable: bool = True
    ) -> T:
        """Run ``work`` in a write transaction, or (``write=False``) a read-only one,
        which neither waits for the writer nor makes it wait. ``durable=False``: the
        commit does not wait for the disk (`_make_durable` catches up if it must)."""

        def run_in(conn: sqlite3.Connection) -> T:
            def run(sql: str, params: Params | None = None) -> list[Row]:
                return self._execute(conn, sql, params)

            with self._writing if write else nullcontext():
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = work(run)
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return result

        return self._run(run_in, durable=durable)

    def _make_durable(self) -> None:
        """Wait for the disk to hold every commit made so far, a relaxed one included.

        One WAL file takes every commit in order, and a ``synchronous=FULL`` commit
        syncs that file: a small durable write (the queue counter moves on, which
        only leaves a gap in the waiters' numbers) carries all earlier ones to disk.
        """
        self.query(_MOVE_SEQ, write=True)

    def _write_one(self, sql: str, params: Params) -> list[Row]:
        """One rendered statement of the lock algorithm that writes, as its own
        transaction (relaxed if the store is). It takes the write lock before it reads
        (as ``BEGIN IMMEDIATE`` does: with `_Writer` held no other writer can come
        between), so its reads and its write see one state."""

        def work(conn: sqlite3.Connection) -> list[Row]:
            with self._writing:
                return conn.execute(sql, params).fetchall()

        self.stats.add("statements")
        return self._run(work, durable=not self.relaxed)

    def query(self, sql: str, params: Params | None = None, *, write: bool = False) -> list[Row]:
        if write:
            return self._in_transaction(lambda run: run(sql, params))
        return self._run(lambda conn: self._execute(conn, sql, params))

    def change(self, statements: Sequence[str], params: Params) -> list[list[str | None]]:
        touched: set[str] = set()

        def work(run: Run) -> tuple[list[list[str | None]], list[Told]]:
            found = [[row["name"] for row in run(sql, params)] for sql in statements]
            touched.update(n for names in found for n in names if n is not None)
            return found, self._look_again(run, touched)

        found, told = self._in_transaction(work)
        self.wakeups.wake(touched)
        self._poke(told)
        return found

    # -- the lock algorithm ----------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> Attempt:
        self.stats.add("attempts")
        single = len(request.names) == 1 and not request.queued
        fought = single and request.names[0] in self._contended
        # A free name is granted by one statement (`queries.TAKE_IDLE`); if it inserts
        # nothing, the full algorithm decides.
        if single and not fought and (taken := self._write_one(_TAKE_IDLE, _one(request))):
            return Attempt("granted", {request.names[0]: taken[0]["token"]})
        woken: set[str] = set()
        found = None
        if request.queued:
            # A waiter looking again mostly finds itself still blocked: learn
            # that without queueing for the write lock, which only changes need.
            found = self._in_transaction(
                lambda run: attempt(run, request, woken, _ENGINE, write=False), write=False
            )
        told: list[Told] = []
        if found is None:
            # A name fought over is almost always found taken: the attempt only
            # queues, and a queue entry a crash forgets is harmless (design note,
            # "Durability"). A grant it makes after all is made durable before
            # anyone is told of it, unless the store is relaxed.
            waits = fought and request.enqueue

            def work(run: Run) -> tuple[Attempt, list[Told]]:
                if waits and (queued := run(_QUEUE_BLOCKED, _one(request))):
                    run(_SEQ_TAKEN, queued[0])
                    return Attempt("blocked", rows=None, seq=queued[0]["seq"]), []
                made = attempt(run, request, woken, _ENGINE)
                assert made is not None  # allowed to write, every path ends in an Attempt
                return made, self._look_again(run, woken)

            found, told = self._in_transaction(work, durable=not (waits or self.relaxed))
            if waits and not self.relaxed and found.status == "granted":
                self._make_durable()
            if single:
                self._contended.note(request.names, found.status != "granted")
        self.wakeups.wake(woken)
        self._poke(told)
        return found

    def release(self, session_id: str, request_id: str, names: Sequence[str]) -> int:
        # As `TAKE_IDLE` for an acquire: one statement where nobody waits.
        if (
            len(names) == 1
            and names[0] not in self._contended
            and self._write_one(
                _RELEASE_IDLE, {"session": session_id, "request": request_id, "name": names[0]}
            )
        ):
            return 1
        params = {"session": session_id, "request": request_id, "names": names}

        def work(run: Run) -> tuple[int, list[Told]]:
            gone = run(_RELEASE, params)
            if len(gone) < len(names):
                # An abandon (or a stamp that lost a lock). A request holding all its
                # names has no queue entries: every grant removes them.
                run(queries.DEQUEUE, params)
            elif not any(row["queued"] for row in gone):
                return len(gone), []  # nobody to let in
            return len(gone), grant(run, names, _ENGINE)

        deleted, told = self._in_transaction(work, durable=not self.relaxed)
        self._contended.note(names, bool(told))
        self._poke(told)  # after the commit: a woken waiter holds its grant
        return deleted

    def _look_again(self, run: Run, names: set[str]) -> list[Told]:
        """The requests of other stores queued on ``names``, each to be poked to attempt
        again: what a change other than a release freed there (a dead holder reclaimed, a
        refused request's queue entries, a closed session's locks, an administrator's
        override), each waiter judges for itself, as it would when the poller woke it.
        This store's own waiters are woken by name (`Wakeups.wake`), the requester among
        them already looking."""
        if not names:
            return []
        rows = run(queries.GRANT_CANDIDATES, {"names": sorted(names)})
        tag = self._tag
        return [
            (r["request_id"], r["session_id"], None)
            for r in rows
            if not r["session_id"].endswith(tag)
        ]

    # -- wake-ups from other processes -----------------------------------------------

    def _poke(self, told: list[Told]) -> None:
        """Tell each request what a release did (`inbox.tell`). A poke that cannot be
        sent (the process is gone, or its inbox full) is left to that process's poller."""
        inbox.tell(told, self._tag, self.wakeups, self._outbox)

    def _watch(self, timeout: float | None) -> None:
        self._listener.start(timeout)
        self._kick()  # someone starts waiting: poll briskly again

    def _kick(self) -> None:
        with suppress(OSError):  # full: a kick is pending anyway
            self._kicks[1].send(b"")

    def _poll(self) -> None:
        conn: sqlite3.Connection | None = None
        version = None
        interval = POLL_MIN
        box = self._listener.inbox
        sources = [self._kicks[0], *([box] if box is not None else [])]
        net = 0.0 if box is None else SAFETY_NET  # without pokes, the poller is all
        self._listener.tried.set()  # the file is there to poll: in force at once
        unanswered = False  # a change seen, and not yet answered by waking every waiter
        answered_at = -net
        while not self._closed.is_set():
            ready, _, _ = select.select(sources, [], [], interval if self.wakeups.waiting else None)
            if self._kicks[0] in ready:
                interval = POLL_MIN
            self._listener.hand_on(ready)  # pokes from releases (`_poke`), and kicks
            if self._closed.is_set() or not self.wakeups.waiting:
                continue
            try:
                conn = conn or self._connect("NORMAL")  # it only reads
                now = conn.execute("PRAGMA data_version").fetchone()["data_version"]
            except sqlite3.Error:
                conn = None
                now = None  # let the waiters look, and meet the trouble themselves
            if now != version or now is None:
                version = now
                interval = POLL_MIN
                unanswered = True
            elif not unanswered:
                interval = min(interval * 2, POLL_MAX)
            if unanswered:
                due = answered_at + net - time.monotonic()
                if due > 0:
                    interval = max(due, POLL_MIN)  # come back when the net may fall again
                else:
                    unanswered, answered_at = False, time.monotonic()
                    self.wakeups.wake_all()
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._kick()
        self._listener.close(timeout=1.0)
        self._pool.close()
        self._relaxed_pool.close()
        self._writing.close()
        self._outbox.close()
        for sock in self._kicks:
            sock.close()
