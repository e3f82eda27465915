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
for _ in range(2):
    sys.stdin.readline()
    print(json.dumps([time.time(), time.time_ns() / 1e9, time.monotonic()]), flush=True)
"""


def test_a_step_moves_the_wall_clock_and_never_the_monotonic_one() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        for signum, expected in ((clock.FORWARD, clock.STEP), (clock.BACK, -clock.STEP)):
            before = time.time()
            os.kill(child.pid, signum)
            time.sleep(0.2)  # the handler runs between the child's bytecodes
            child.stdin.write("\n")
            child.stdin.flush()
            wall, wall_ns, monotonic = json.loads(child.stdout.readline())
            assert abs(wall - before - expected) < 5
            assert abs(wall_ns - wall) < 1
            assert abs(monotonic - time.monotonic()) < 5  # one clock for the machine
            os.kill(child.pid, clock.BACK if signum == clock.FORWARD else clock.FORWARD)
            time.sleep(0.2)
    finally:
        child.kill()
        child.wait()
