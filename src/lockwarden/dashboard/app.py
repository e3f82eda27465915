"""The dashboard's web application: one page, one event stream, /metrics.

The page opens ``/events`` (server-sent events) and redraws on every message.
One poller per server takes a snapshot of the store every ``interval`` and
sends it to every open stream whose filter it changes, so the store sees one
reader however many browsers watch, and an idle store costs the page nothing.

Access: on a loopback address anyone on this host may look (as with
`lockwarden status`). Bound to any other address the server refuses to start
without a token, and then every request must carry it, as ``?token=`` (the
page passes its own on to its stream) or ``Authorization: Bearer``. The
token is compared in constant time and never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from lockwarden.errors import LockUsageError
from lockwarden.observe.metrics import StoreCollector
from lockwarden.observe.snapshot import Snapshot

if TYPE_CHECKING:
    from lockwarden.store import Store

log = logging.getLogger("lockwarden.dashboard")

ROW_LIMIT = 500
"""Rows of each table sent to the page (the counts say how many there are): a browser
redrawing 10,000 rows twice a second is slow, and nobody reads past a screenful."""


class _Poller:
    """Takes a snapshot every ``interval`` while anyone watches; hands the latest to each stream."""

    def __init__(self, store: Store, interval: float) -> None:
        self._store = store
        self._interval = interval
        self._latest: Snapshot | None = None
        self._changed = asyncio.Condition()
        self._watchers = 0
        self._task: asyncio.Task[None] | None = None

    async def latest(self) -> Snapshot:
        """The newest snapshot, taken now if the last is older than the interval."""
        if self._latest is None or time.time() - self._latest.taken_at > self._interval:
            self._latest = await asyncio.to_thread(Snapshot.take, self._store)
        return self._latest

    async def stream(self) -> AsyncIterator[Snapshot]:
        self._watchers += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            yield await self.latest()
            while True:
                async with self._changed:
                    await self._changed.wait()
                yield await self.latest()
        finally:
            self._watchers -= 1

    async def _run(self) -> None:
        while self._watchers > 0:
            await asyncio.sleep(self._interval)
            try:
                snap = await asyncio.to_thread(Snapshot.take, self._store)
            except Exception as exc:  # the store is down: keep the page, say so in the log
                log.warning("dashboard: reading the store failed: %s", exc)
                continue
            self._latest = snap
            async with self._changed:
                self._changed.notify_all()


def create_app(
    store: Store,
    *,
    token: str | None = None,
    interval: float = 0.5,
    max_names: int = 50,
) -> Starlette:
    """The dashboard for ``store``: ``/``, ``/events``, ``/snapshot.json`` and ``/metrics``.

    ``token``: required on every request if given. ``interval``: seconds
    between snapshots while a page is open. ``max_names``: how many lock
    names get series of their own in /metrics.
    """
    if not interval > 0:
        raise LockUsageError(f"interval must be a positive number of seconds, got {interval!r}")
    poller = _Poller(store, interval)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, max_names=max_names))
    page = resources.files(__package__).joinpath("static/index.html").read_text("utf-8")

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            if token is not None and not _authorized(request, token):
                return Response("a token is required: add ?token=...\n", status_code=401)
            return await handler(request)

        return checked

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def snapshot(request: Request) -> Response:
        snap = (await poller.latest()).only(request.query_params.get("filter", ""))
        return JSONResponse(snap.to_json(limit=_limit(request)) | {"store": store.url})

    async def events(request: Request) -> Response:
        prefix = request.query_params.get("filter", "")
        limit = _limit(request)

        async def messages() -> AsyncIterator[str]:
            last = ""
            async for snap in poller.stream():
                if await request.is_disconnected():
                    return
                body = json.dumps(snap.only(prefix).to_json(limit=limit) | {"store": store.url})
                if body != last:
                    last = body
                    yield f"data: {body}\n\n"

        return StreamingResponse(
            messages(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def metrics(request: Request) -> Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/", guarded(index)),
            Route("/events", guarded(events)),
            Route("/snapshot.json", guarded(snapshot)),
            Route("/metrics", guarded(metrics)),
        ]
    )


def _limit(request: Request) -> int:
    try:
        return max(1, min(int(request.query_params.get("limit", ROW_LIMIT)), 100_000))
    except ValueError:
        return ROW_LIMIT


def _authorized(request: Request, token: str) -> bool:
    given = request.query_params.get("token", "")
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        given = header[7:].strip()
    return hmac.compare_digest(given.encode(), token.encode())


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    token: str | None = None,
    max_names: int = 50,
) -> None:
    """Run the dashboard until interrupted; refuses a non-loopback ``host`` without a token."""
    if token is None and not is_loopback(host):
        raise LockUsageError(
            f"the dashboard on {host} would be open to the network: give it a token "
            "(--token, or $LOCKWARDEN_DASHBOARD_TOKEN), or listen on 127.0.0.1"
        )
    import uvicorn  # noqa: PLC0415 - the web server is needed only to serve

    app = create_app(store, token=token, max_names=max_names)
    uvicorn.run(app, host=host, port=port, log_level="warning")
