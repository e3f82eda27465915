"""A dashboard served on a free loopback port, and a real Chromium to look at it."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from lockwarden.dashboard import create_app
from lockwarden.store import Store

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """Start a dashboard for a store; returns its base URL. Stopped at the end."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(watched: Store, **options: Any) -> str:
        port = free_port()
        config = uvicorn.Config(
            create_app(watched, **options), host="127.0.0.1", port=port, log_level="warning"
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, driven by Playwright (no browser is downloaded).

    Module-scoped: Playwright's synchronous API runs an event loop in this
    thread while it is open, and a later test's ``asyncio.run`` would fail.
    """
    if not shutil.which(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: `.ci/run` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    yield context.new_page()
    context.close()
