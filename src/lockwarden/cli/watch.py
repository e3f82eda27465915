"""`lockwarden dashboard` and `lockwarden metrics`: watching a store, never changing it.

Both come from `lockwarden.observe` and the `dashboard` extra (Starlette,
uvicorn, prometheus-client); without the extra they say how to install it.
"""

from __future__ import annotations

import argparse
import os
import sys

from lockwarden.cli.common import EX_UNAVAILABLE, CliError, open_store

TOKEN_ENV = "LOCKWARDEN_DASHBOARD_TOKEN"


def dashboard(args: argparse.Namespace, url: str) -> int:
    """Serve the page and /metrics until interrupted."""
    _need_extra()
    from lockwarden.dashboard import serve  # noqa: PLC0415

    token = getattr(args, "token", None) or os.environ.get(TOKEN_ENV) or None
    with open_store(url, create=False) as store:
        where = f"http://{args.host}:{args.port}/"
        print(f"lockwarden dashboard of {store.url} on {where} (Ctrl-C ends it)", file=sys.stderr)
        serve(store, host=args.host, port=args.port, token=token, max_names=args.max_names)
    return 0


def metrics(args: argparse.Namespace, url: str) -> int:
    """Print one scrape of the store's metrics."""
    _need_extra()
    from prometheus_client import CollectorRegistry, generate_latest  # noqa: PLC0415

    from lockwarden.observe.metrics import StoreCollector  # noqa: PLC0415

    with open_store(url, create=False) as store:
        registry = CollectorRegistry()
        registry.register(StoreCollector(store, max_names=args.max_names))
        sys.stdout.write(generate_latest(registry).decode())
    return 0


def _need_extra() -> None:
    try:
        import prometheus_client  # noqa: F401, PLC0415
        import starlette  # noqa: F401, PLC0415
        import uvicorn  # noqa: F401, PLC0415
    except ImportError as exc:
        raise CliError(
            EX_UNAVAILABLE,
            f"this command needs the dashboard extra ({exc.name} is missing): "
            "pip install 'lockwarden[dashboard]'",
        ) from None
