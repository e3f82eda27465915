"""The read/write latch: counts only, writers and readers both served."""

from __future__ import annotations

import threading
import time

import pytest

from lockwarden import NotHeld
from lockwarden.local import RWLatch


def test_readers_share_and_a_writer_excludes_everyone() -> None:
    latch = RWLatch()
    assert latch.acquire_read() and latch.acquire_read()
    assert latch.readers == 2
    assert not latch.acquire_write(timeout=0.01)
    latch.release_read()
    latch.release_read()
    assert latch.acquire_write(timeout=0)
    assert latch.writing
    assert not latch.acquire_read(timeout=0.01)
    assert not latch.acquire_write(timeout=0.01)
    latch.release_write()
    with latch.read():
        assert latch.readers == 1
    with latch.write():
        assert latch.writing
    assert latch.readers == 0 and not latch.writing


def test_a_waiting_writer_holds_back_new_readers() -> None:
    latch = RWLatch()
    latch.acquire_read()
    got = threading.Event()
    writer = threading.Thread(target=lambda: (latch.acquire_write(), got.set()))
    writer.start()
    while not latch._writers_waiting:
        time.sleep(0.001)
    assert not latch.acquire_read(timeout=0.02)  # the writer is next
    latch.release_read()
    assert got.wait(2)
    latch.release_write()
    writer.join()


def test_a_writer_that_gives_up_lets_the_held_back_readers_in() -> None:
    latch = RWLatch()
    latch.acquire_read()
    assert not latch.acquire_write(timeout=0.02)
    assert latch.acquire_read(timeout=0)
    assert latch.readers == 2


def test_writers_are_not_starved_by_a_stream_of_readers() -> None:
    latch = RWLatch()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with latch.read():
                time.sleep(0.0005)

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for t in readers:
        t.start()
    try:
        for _ in range(5):
            assert latch.acquire_write(timeout=2)
            latch.release_write()
    finally:
        stop.set()
        for t in readers:
            t.join()


def test_readers_are_not_starved_by_a_stream_of_writers() -> None:
    latch = RWLatch()
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            with latch.write():
                time.sleep(0.0005)

    writers = [threading.Thread(target=writer) for _ in range(3)]
    for t in writers:
        t.start()
    try:
        for _ in range(5):
            assert latch.acquire_read(timeout=2)
            latch.release_read()
    finally:
        stop.set()
        for t in writers:
            t.join()


def test_release_without_acquire_is_not_held() -> None:
    latch = RWLatch()
    with pytest.raises(NotHeld):
        latch.release_read()
    with pytest.raises(NotHeld):
        latch.release_write()
