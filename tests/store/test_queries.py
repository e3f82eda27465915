"""The shared SQL text: rendered for each target with every hole filled."""

from __future__ import annotations

import pytest

from lockwarden.store.backends.sql import queries

TEXTS = [
    value
    for name, value in vars(queries).items()
    if name.isupper() and isinstance(value, str) and "{p}" in value
] + [text for value in vars(queries).values() if type(value) is tuple for text in value]


def test_there_is_shared_text() -> None:
    assert len(TEXTS) > 20


@pytest.mark.parametrize("text", TEXTS)
def test_rendered_for_each_target(text: str) -> None:
    sqlite, pg, plpgsql = queries.SQLITE, queries.postgres("lw_s"), queries.plpgsql("lw_s")
    for dialect in (sqlite, pg, plpgsql):
        rendered = dialect.render(text)
        assert "{" not in rendered and "}" not in rendered
    assert "lw_s." not in sqlite.render(text)
    assert ":" not in pg.render(text).replace("::", "")  # parameters became %(name)s
    assert "%(" not in plpgsql.render(text) and ":" not in plpgsql.render(text).replace("::", "")


def test_the_liveness_predicate_is_one_text() -> None:
    users = [t for t in TEXTS if "s.heartbeat_at + s.ttl" in t]
    assert len(users) >= 6
    assert all(queries.LIVE.format(now="{now}") in t for t in users)
