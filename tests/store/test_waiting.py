"""The waiting loop's pure parts: the cycle it reports, the words it uses."""

from __future__ import annotations

from lockwarden import Mode
from lockwarden.store.waiting import _cycle, describe


def test_the_cycle_through_the_requester_is_found() -> None:
    edges = [("me", "a"), ("a", "b"), ("b", "a"), ("b", "c"), ("c", "me"), ("a", "x")]
    assert _cycle("me", edges) == ("me", "a", "b", "c")
    assert _cycle("me", [("me", "a"), ("a", "me"), ("me", "b"), ("b", "c"), ("c", "me")]) == (
        "me",
        "a",
    )


def test_requests_are_described_in_words() -> None:
    assert describe([("a", Mode.X)]) == "write lock on 'a'"
    assert describe([("a", Mode.S), ("b", Mode.X)]) == "locks on 'a' (read), 'b' (write)"
