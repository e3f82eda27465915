"""The dashboard in a real browser: it shows the store, follows it live, marks deadlocks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lockwarden.dashboard.app import is_loopback
from lockwarden.dashboard.app import serve as serve_forever
from lockwarden.errors import LockUsageError
from lockwarden.store import Store
from tests.conftest import Background, wait_for
from tests.observe.conftest import frozen_cycle

SCREENSHOT = Path(__file__).parents[2] / "docs" / "images" / "dashboard.png"


def rows(page: Any, table: str) -> list[list[str]]:
    return page.eval_on_selector_all(
        f"#{table} tbody tr:not(:has(.empty))",
        "rows => rows.map(r => [...r.cells].map(c => c.textContent))",
    )


def test_the_page_shows_holders_waiters_in_queue_order_and_sessions(
    store: Store, serve: Callable[..., str], page: Any
) -> None:
    holder = store.session(app_id="billing")
    first, second = store.session(app_id="reports"), store.session(app_id="audit")
    lock = holder.lock("invoices")
    queued = [Background(lambda: first.lock("invoices", timeout=30))]
    wait_for(lambda: len(store.waiters()) == 1)
    queued.append(Background(lambda: second.lock("invoices", mode="read", timeout=30)))
    wait_for(lambda: len(store.waiters()) == 2)

    page.goto(serve(store))
    page.wait_for_function("document.querySelectorAll('#waiters tbody tr td.num').length >= 2")
    [held] = rows(page, "locks")
    assert held[:3] == ["invoices", "write", "billing"]
    assert held[5] == str(lock.token)
    assert [r[:3] for r in rows(page, "waiters")] == [
        ["invoices", "write", "reports"],
        ["invoices", "read", "audit"],
    ]
    assert sorted(r[1] for r in rows(page, "sessions")) == ["audit", "billing", "reports"]
    assert page.locator("#graph .node").count() == 3  # the two waiters and the holder
    assert page.locator("#graph .cycle").count() == 0

    if os.environ.get("LOCKWARDEN_UPDATE_SCREENSHOT"):
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)

    # Live: the lock moves to the first waiter, and the page follows within a second.
    lock.release()
    page.wait_for_function(
        "[...document.querySelectorAll('#locks tbody tr')]"
        ".some(r => r.cells[2] && r.cells[2].textContent === 'reports')",
        timeout=1000,
    )
    queued[0].result().release()
    queued[1].result().release()


def test_the_page_marks_a_cycle_of_waits(
    store: Store, serve: Callable[..., str], page: Any
) -> None:
    page.goto(serve(store))
    page.wait_for_function("document.body.dataset.takenAt")
    assert page.locator("#graph .cycle").count() == 0
    a, b = frozen_cycle(store)
    page.wait_for_selector("#graph .node.cycle", timeout=5000)
    cycle_nodes = page.eval_on_selector_all(
        "#graph .node.cycle", "nodes => nodes.map(n => n.dataset.session)"
    )
    assert sorted(cycle_nodes) == sorted([a.id, b.id])
    assert page.locator("#graph .edge.cycle").count() == 2
    assert "cycle" in page.text_content("#cycles")


def test_the_filter_shows_only_matching_names(
    store: Store, serve: Callable[..., str], page: Any
) -> None:
    s = store.session(app_id="app")
    for name in ("deploy/web", "deploy/db", "cron/backup"):
        s.lock(name)
    page.goto(serve(store) + "?filter=deploy/")
    page.wait_for_function("document.querySelectorAll('#locks tbody tr td.num').length")
    assert sorted(r[0] for r in rows(page, "locks")) == ["deploy/db", "deploy/web"]
    page.fill("#filter", "cron/")
    page.wait_for_function(
        "[...document.querySelectorAll('#locks tbody tr')].map(r => r.cells[0].textContent)"
        ".join() === 'cron/backup'"
    )


def test_names_are_shown_as_text_not_markup_with_control_characters_visible(
    store: Store, serve: Callable[..., str], page: Any
) -> None:
    s = store.session(app_id="<b>app</b>")
    s.lock("<img src=x onerror=alert(1)>\x1b[2J")
    page.goto(serve(store))
    page.wait_for_function("document.querySelectorAll('#locks tbody tr td.num').length")
    [row] = rows(page, "locks")
    assert row[0] == "<img src=x onerror=alert(1)>\\x1b[2J"
    assert row[2] == "<b>app</b>"
    assert page.locator("#locks img").count() == 0


def test_ten_thousand_locks_stay_fast_to_show(
    store: Store, serve: Callable[..., str], page: Any
) -> None:
    s = store.session(app_id="bulk")
    for batch in range(0, 10_000, 1000):  # an etcd transaction holds a few thousand operations
        s.lock_many([(f"row/{i:05}", "write") for i in range(batch, batch + 1000)])
    page.goto(serve(store))
    page.wait_for_function("document.querySelectorAll('#locks tbody tr td.num').length")
    assert len(rows(page, "locks")) == 500
    assert page.text_content("#locks-count") == "(500 of 10000)"
    page.fill("#filter", "row/0999")
    page.wait_for_function("document.querySelectorAll('#locks tbody tr').length === 10")


def test_metrics_endpoint_is_prometheus_text(store: Store, serve: Callable[..., str]) -> None:
    store.session(app_id="m").lock("x")
    body = httpx.get(serve(store) + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["lockwarden_locks_held"].type == "gauge"
    assert any(
        s.labels == {"mode": "write", "name": "x"} and s.value == 1
        for s in families["lockwarden_locks_held"].samples
    )


def test_a_token_guards_every_endpoint(store: Store, serve: Callable[..., str]) -> None:
    base = serve(store, token="s3cret")
    for path in ("/", "/snapshot.json", "/metrics", "/events"):
        assert httpx.get(base + path).status_code == 401
    assert httpx.get(base + "/snapshot.json?token=s3cret").status_code == 200
    headers = {"Authorization": "Bearer s3cret"}
    assert httpx.get(base + "/metrics", headers=headers).status_code == 200
    assert httpx.get(base + "/metrics?token=wrong").status_code == 401


def test_it_refuses_to_listen_beyond_loopback_without_a_token(store: Store) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(LockUsageError, match="token"):
        serve_forever(store, host="0.0.0.0", port=0)
