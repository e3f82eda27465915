"""Cycles of the waits-for graph, against the definition: nodes that reach themselves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lockwarden.observe import cycles

nodes = st.sampled_from([f"s{i}" for i in range(8)])


def reaches(edges: list[tuple[str, str]], src: str, dst: str) -> bool:
    seen, todo = set(), [src]
    while todo:
        node = todo.pop()
        for a, b in edges:
            if a == node and b not in seen:
                if b == dst:
                    return True
                seen.add(b)
                todo.append(b)
    return False


@given(st.lists(st.tuples(nodes, nodes), max_size=20))
def test_cycles_are_exactly_the_nodes_that_reach_themselves_grouped_by_mutual_reach(
    edges: list[tuple[str, str]],
) -> None:
    found = cycles(edges)
    on_cycle = {n for a, b in edges for n in (a, b) if reaches(edges, n, n)}
    assert {n for group in found for n in group} == on_cycle
    for group in found:
        assert all(reaches(edges, a, b) for a in group for b in group if a != b)
    members = [n for group in found for n in group]
    assert len(members) == len(set(members))  # each node in one group


def test_a_chain_has_no_cycle_and_a_long_ring_is_one() -> None:
    assert cycles([("a", "b"), ("b", "c")]) == []
    ring = [(f"n{i}", f"n{(i + 1) % 20_000}") for i in range(20_000)]  # deeper than recursion
    assert len(cycles(ring)[0]) == 20_000
    assert cycles([("x", "x"), ("a", "b")]) == [["x"]]
