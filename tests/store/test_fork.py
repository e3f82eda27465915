"""After fork(), the parent's store serves the child (with the child's own connections and
threads); the parent's sessions and locks stay the parent's."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from typing import Any

import lockwarden
from lockwarden.store import Store


def _in_child(store: Store, session: lockwarden.store.Session) -> dict[str, Any]:
    """What a forked child finds: the parent's session refuses, the store serves the child."""
    found: dict[str, Any] = {}
    for what, use in {
        "lock": lambda: session.lock("other", timeout=0),
        "release": lambda: session.release(session.held[0]),
        "renew": session.renew,
    }.items():
        try:
            use()
        except lockwarden.LockUsageError as exc:
            found[what] = "forked" if "forked from" in str(exc) else str(exc)
    with store.session(app_id="child", ttl=0.6) as s:  # the parent's store, the child's session
        found["parent's lock busy"] = s.try_lock("parent") is None
        lock = s.lock("child")
        import time  # noqa: PLC0415

        time.sleep(1.5)  # longer than the TTL: the child's own heartbeat keeps it
        lock.check()
        found["token"] = lock.token
        found["locks"] = sorted(e.name for e in store.locks())
    session.close()  # the parent's: only forgotten here
    store.close()  # the child's own connections and threads
    return found


def test_after_os_fork_the_store_serves_the_child_and_the_parents_session_refuses(
    url: str,
) -> None:
    store = lockwarden.connect(url)
    session = store.session(app_id="parent", ttl=5)
    mine = session.lock("parent")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child reports through the pipe)
        try:
            os.close(read)
            report = _in_child(store, session)
        except BaseException as exc:
            report = {"error": repr(exc)}
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert report.pop("token") > mine.token  # a lock of the child's own store
    assert report == {
        "lock": "forked",
        "release": "forked",
        "renew": "forked",
        "parent's lock busy": True,
        "locks": ["child", "parent"],
    }
    # Nothing the child did reached the parent's connections or locks.
    mine.check()
    assert [e.name for e in store.locks()] == ["parent"]
    assert store.stats["retries"] == 0
    session.close()
    store.close()


def _worker(store: Store, results: Any) -> None:
    try:
        with store.session(app_id="worker") as s:  # the parent's store, inherited
            busy = s.try_lock("parent") is None
            for _ in range(20):  # the workers take turns on one name
                with s.lock("shared", timeout=30):
                    pass
            with s.lock(f"w{os.getpid()}"):
                results.put(("ok", busy))
    except BaseException as exc:
        results.put(("error", repr(exc)))


def test_multiprocessing_fork_workers_use_the_parents_store(url: str) -> None:
    ctx = multiprocessing.get_context("fork")
    with lockwarden.connect(url) as store, store.session(app_id="parent") as s:
        mine = s.lock("parent")
        results = ctx.Queue()
        workers = [ctx.Process(target=_worker, args=(store, results)) for _ in range(3)]
        for w in workers:
            w.start()
        got = [results.get(timeout=60) for _ in workers]
        for w in workers:
            w.join(60)
            assert w.exitcode == 0
        assert got == [("ok", True)] * 3
        mine.check()
        assert store.stats["retries"] == 0


CHILD_EXITS_NORMALLY = """
import gc, json, os, sys, lockwarden
store = lockwarden.connect(sys.argv[1])
session = store.session(app_id="parent", ttl=5)
lock = session.lock("parent")
store.locks()  # a connection idle in the pool when the child is forked
pid = os.fork()
if pid == 0:
    with store, session:  # leaving them in the child only forgets them
        pass
    del store, session, lock
    gc.collect()  # the inherited connections are freed in the child
    sys.exit(0)  # atexit and the interpreter's teardown run here, in the child
os.waitpid(pid, 0)
lock.check()
print(json.dumps({"retries": store.stats["retries"], "names": [e.name for e in store.locks()]}))
"""


def test_a_child_exiting_normally_neither_releases_nor_disturbs_the_parents_locks(
    url: str,
) -> None:
    assert _report_of(CHILD_EXITS_NORMALLY, url) == {"retries": 0, "names": ["parent"]}


def _report_of(script: str, url: str) -> Any:
    """Run ``script`` with the store's URL in a new interpreter; what it printed, as JSON."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


PRELOADED = """
import json, os, sys, lockwarden
store = lockwarden.connect(sys.argv[1])  # at import, as under gunicorn --preload or Celery
with store.session(app_id="master") as master:
    held = master.lock("master")
    workers = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:  # a worker: serves requests with the store it inherited, then exits
            with store.session(app_id="worker") as s:
                for _ in range(20):
                    with s.lock("shared", timeout=30) as lock:
                        assert lock.token > held.token
                assert s.try_lock("master") is None
            sys.exit(0)  # atexit and the interpreter's teardown run in the worker
        workers.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in workers]
    held.check()
    print(json.dumps({"codes": codes, "retries": store.stats["retries"],
                      "names": sorted(e.name for e in store.locks())}))
store.close()
"""


def test_a_preloaded_store_serves_forked_workers_and_their_exits_leave_the_master_alone(
    url: str,
) -> None:
    report = _report_of(PRELOADED, url)
    assert report == {"codes": [0, 0, 0], "retries": 0, "names": ["master"]}
