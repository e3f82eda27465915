"""The mode algebra: the compatibility matrix and the upgrade lattice."""

from __future__ import annotations

import enum
import itertools
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lockwarden
from lockwarden import LockUsageError, Mode

IS, IX, S, SIX, X = Mode.IS, Mode.IX, Mode.S, Mode.SIX, Mode.X

# The textbook multi-granularity matrix, written out in full so a typo in the
# module's table cannot hide behind a symmetric derivation.
MATRIX = {
    IS: {IS: True, IX: True, S: True, SIX: True, X: False},
    IX: {IS: True, IX: True, S: False, SIX: False, X: False},
    S: {IS: True, IX: False, S: True, SIX: False, X: False},
    SIX: {IS: True, IX: False, S: False, SIX: False, X: False},
    X: {IS: False, IX: False, S: False, SIX: False, X: False},
}

modes = st.sampled_from(list(Mode))


@pytest.mark.parametrize(("held", "wanted"), list(itertools.product(Mode, Mode)))
def test_compatibility_matrix(held: Mode, wanted: Mode) -> None:
    assert held.compatible(wanted) is MATRIX[held][wanted]


@pytest.mark.parametrize(
    ("held", "asked", "result"),
    [
        (IX, S, SIX),  # the one join that is a new mode
        (S, IX, SIX),
        (S, IS, S),  # weaker re-request: nothing changes
        (IS, X, X),
        (IS, IX, IX),
        (IS, S, S),
        (SIX, IX, SIX),
        (SIX, S, SIX),
        (X, IS, X),
        (IX, IX, IX),
    ],
)
def test_join(held: Mode, asked: Mode, result: Mode) -> None:
    assert held.join(asked) is result


@given(modes, modes, modes)
def test_join_is_a_least_upper_bound(a: Mode, b: Mode, c: Mode) -> None:
    j = a.join(b)
    assert j is b.join(a)
    assert j.covers(a) and j.covers(b)
    if c.covers(a) and c.covers(b):  # anything above both is above the join
        assert c.covers(j)
    assert a.join(b.join(c)) is a.join(b).join(c)


@given(modes, modes)
def test_a_stronger_mode_conflicts_with_at_least_as_much(a: Mode, b: Mode) -> None:
    if a.covers(b):
        assert a.conflicts & b.conflicts == b.conflicts


def test_intention_and_hierarchy_properties() -> None:
    assert [m for m in Mode if m.is_intention] == [IS, IX]
    assert {m: m.parent_intention for m in Mode} == {IS: IS, S: IS, IX: IX, SIX: IX, X: IX}
    assert {m: m.implied_on_descendants for m in Mode} == {
        IS: None, IX: None, S: S, SIX: S, X: X,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("text", "mode"),
    [("read", S), ("WRITE", X), (" shared ", S), ("exclusive", X), ("six", SIX), ("IX", IX)],
)
def test_parse(text: str, mode: Mode) -> None:
    assert Mode.parse(text) is mode
    assert Mode.parse(mode) is mode


@pytest.mark.parametrize("bad", ["", "rw", "update", 1, None, b"read"])
def test_parse_rejects_with_a_usage_error(bad: object) -> None:
    with pytest.raises(LockUsageError, match="unknown lock mode"):
        Mode.parse(bad)  # type: ignore[arg-type]


def test_modes_hash_by_identity_and_pickle_to_the_same_member() -> None:
    assert {m: m.value for m in Mode}[X] == "X"
    assert pickle.loads(pickle.dumps(SIX)) is SIX


def test_a_mode_is_shown_as_the_json_spells_it_and_reads_back(tmp_path: Path) -> None:
    """``print(entry.mode)`` showed ``Mode.X`` where ``status --json`` says "write"."""
    assert [str(m) for m in Mode] == ["IS", "IX", "read", "SIX", "write"]
    assert f"{S} {X}" == "read write"
    assert all(Mode.parse(str(m)) is m for m in Mode)
    assert repr(X) == "Mode.X" and isinstance(X, enum.Enum)  # still the enum, named so
    store = lockwarden.connect(str(tmp_path / "locks.db"))
    with store, store.session(app_id="a") as session, session.lock("n", mode="read"):
        [entry] = store.locks()
        assert (str(entry.mode), entry.mode) == ("read", S)
        assert str(entry.mode) == entry.mode.word
