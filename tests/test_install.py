"""The library and its test tools install on a machine with no compiler and no headers."""

from __future__ import annotations

from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def installed_for(name: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Every distribution ``name`` with ``extras`` needs, itself included, as installed here."""
    seen: set[str] = set()
    todo = [(canonicalize_name(name), extras)]
    while todo:
        project, wanted = todo.pop()
        if project in seen and not wanted:
            continue
        seen.add(project)
        for text in metadata.requires(project) or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(
                marker.evaluate({**default_environment(), "extra": extra})
                for extra in ("", *wanted)
            ):
                todo.append((canonicalize_name(requirement.name), tuple(requirement.extras)))
    return seen


def test_every_dependency_of_the_tests_is_a_published_wheel_or_pure_python() -> None:
    """A wheel built here (tag ``linux_x86_64``) means pip compiled it: a fresh machine
    without MariaDB's headers could not (the MySQL driver once needed them)."""
    built_here = {}
    for project in installed_for("lockwarden", ("test",)) - {"lockwarden"}:
        wheel = metadata.distribution(project).read_text("WHEEL") or ""
        tags = [
            line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")
        ]
        if not all(
            tag.endswith("-none-any") or "manylinux" in tag or "musllinux" in tag for tag in tags
        ):
            built_here[project] = tags
    assert built_here == {}
    assert {"pymysql", "psycopg-binary", "etcd3gw", "pytest-xdist"} <= installed_for(
        "lockwarden", ("test",)
    )
