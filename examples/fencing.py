"""A fencing token turning away the late write of a holder that was frozen past its lease.

    python examples/fencing.py [STORE-URL]

(default: an SQLite file in a new temporary directory; a PostgreSQL URL works
the same.) A lock alone cannot stop this: a holder is frozen in the middle of
a read-modify-write (a long GC pause, a VM migration, SIGSTOP here), its
heartbeat stops with it, and after the TTL the lock passes to someone else.
When the frozen holder wakes, nothing has told it yet; it goes on and writes.
What saves the data is the protected resource checking the token that comes
with each access: here an account balance kept behind a `Fence` (a register
in the store's database that refuses a write with a token older than one it
has already seen).

1. ``slow`` (a second process) takes the write lock on "account", reads the
   balance through the fence with its token, and is frozen before it writes.
2. This process waits for the lock; once slow's session is a TTL old it
   takes the lock over with a newer token and deposits 10.
3. slow is thawed and writes what it had computed. The fence refuses it
   (`LockLost`), so the deposit is not lost. Without the fence the balance
   would be slow's stale value.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import lockwarden

TTL = 2.0
"""Seconds a frozen holder keeps the lock: short, so that the example is quick, yet long
enough that a busy machine's slow heartbeat (bounded to a sixth of it) is not reported."""


def slow(url: str) -> None:
    """The holder that gets frozen: read, wait to be told to go on, write."""
    with lockwarden.connect(url) as store, store.session(app_id="slow", ttl=TTL) as session:
        lock = session.lock("account", timeout=10)
        balance = int(store.fence("account").read(lock.token) or 0)
        print(f"slow: holding 'account' with token {lock.token}, balance {balance}", flush=True)
        sys.stdin.readline()  # frozen here; thawed, it goes on as if nothing happened
        try:
            store.fence("account").write(lock.token, str(balance + 50))
            print("slow: wrote", balance + 50, flush=True)
        except lockwarden.LockLost as refused:
            print(f"slow: write refused: {refused}", flush=True)


def main(url: str) -> int:
    with lockwarden.connect(url) as store, store.session(app_id="fast", ttl=TTL) as session:
        with session.lock("account") as setup:
            store.fence("account").write(setup.token, "100")
        child = subprocess.Popen(
            [sys.executable, __file__, "--slow", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        print(child.stdout.readline(), end="")
        os.kill(child.pid, signal.SIGSTOP)
        print("slow: frozen before its write")
        try:
            with session.lock("account", timeout=10 * TTL) as lock:  # waits out slow's TTL
                fence = store.fence("account")
                balance = int(fence.read(lock.token) or 0)
                fence.write(lock.token, str(balance + 10))
                took = f"fast: took 'account' over with token {lock.token}"
                print(f"{took}: {balance} -> {balance + 10}")
        finally:
            os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("go on\n")
        child.stdin.flush()
        print(child.stdout.read(), end="")
        child.wait()
        final = store.fence("account").state()[1]
        print("balance:", final)
        return 0 if final == "110" else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--slow"]:
        slow(sys.argv[2])
    else:
        default = f"sqlite:///{tempfile.mkdtemp(prefix='lockwarden-fencing-')}/locks.db"
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else default))
