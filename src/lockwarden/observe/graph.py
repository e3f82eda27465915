"""Cycles in the waits-for graph: the strongly connected components that wait on themselves.

A deadlock across sessions is a cycle of waits. The store breaks one at the
next attempt of a session on it, so a cycle seen here is either that moment
or sessions whose attempts have stopped (a frozen process): either way the
first thing an operator wants marked.
"""

from __future__ import annotations

from collections.abc import Iterable


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The node sets that lie on a cycle, each sorted, in a stable order.

    Tarjan's algorithm, iterative (a graph of 10,000 waiters would overflow
    Python's recursion limit): every component of two or more nodes, and a
    node with an edge to itself.
    """
    succ: dict[str, list[str]] = {}
    loops: set[str] = set()
    for src, dst in edges:
        succ.setdefault(src, []).append(dst)
        succ.setdefault(dst, [])
        if src == dst:
            loops.add(src)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in succ:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            children = succ[node]
            if i < len(children):
                work.append((node, i + 1))
                child = children[i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if work:  # returning to the parent: carry the low-link up
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in loops:
                    found.append(sorted(component))
    return sorted(found)
