"""The nemesis's clock steps move a worker's wall clock, and only its wall clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from chaos import clock

CHILD = """
import json, sys, time
from chaos import clock
clock.install()
print("ready", flush=True)
for _ in sys.stdin:
    print(json.dumps([time.time(), time.time_ns() / 1e9, time.monotonic()]), flush=True)
"""


def test_a_step_moves_the_wall_clock_and_never_the_monotonic_one() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    stdin, stdout = child.stdin, child.stdout

    def stepped(signum: int, offset: float, was: float) -> tuple[float, float, float]:
        """Send ``signum``; the child's clocks once its wall clock is ``offset`` from ours
        (``was`` until then).

        Each step is seen applied before the next is sent: two of the same
        signal pending at once would arrive as one.
        """
        os.kill(child.pid, signum)
        deadline = time.monotonic() + 30
        while True:
            before = time.time()
            stdin.write("\n")
            stdin.flush()
            wall, wall_ns, monotonic = json.loads(stdout.readline())
            if abs(wall - before - offset) < 5:
                return wall, wall_ns, monotonic
            assert abs(wall - before - was) < 5, "stepped by the wrong amount"
            assert time.monotonic() < deadline, "the step never happened"
            time.sleep(0.01)

    try:
        assert stdout.readline().strip() == "ready"
        for signum, offset in ((clock.FORWARD, clock.STEP), (clock.BACK, -clock.STEP)):
            wall, wall_ns, monotonic = stepped(signum, offset, 0)
            assert abs(wall_ns - wall) < 1
            assert abs(monotonic - time.monotonic()) < 5  # one clock for the machine
            stepped(clock.BACK if signum == clock.FORWARD else clock.FORWARD, 0, offset)
    finally:
        child.kill()
        child.wait()
