"""`lockwarden dashboard`: a read-only web page of a store's locks, live, and its /metrics.

`app.py` is the web application (Starlette): the page, its event stream and
Prometheus' endpoint; `static/` is the page itself, plain HTML, CSS and
JavaScript with no build step. Both read the store only through
`lockwarden.observe`: the dashboard can never break or release a lock.
"""

from lockwarden.dashboard.app import create_app, serve

__all__ = ["create_app", "serve"]
