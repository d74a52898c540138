"""The web layer of `shardq serve`: the HTTP API and the review inbox, one application.

This package (bin/web/) owns everything served over HTTP:

- app.py: `create_app`, the Starlette application over one AsyncClient;
- api.py: the JSON management API under /api/shardq, its route table;
- openapi.py: the API's OpenAPI document, and the body keys each route takes;
- inbox.py, forms.py, templates/, static/: the review inbox under /inbox;
- refusals.py: how a refused request is answered, by either;
- rules.py: how a key or a JSON value a caller sends is read (the CLI reads its
  options by these rules too, so the two front ends cannot drift apart);
- tokens.py: the bearer tokens and the tokens file;
- state.py: what every handler shares, kept on the application;
- serving.py: the application of `shardq serve`, in one process or several.

The CLI imports this package to serve; nothing here imports the CLI
(bin/loading.py reads `--app` and the shard map for both).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from shardq.bin.web import api, explorer, inbox, schedules
from shardq.bin.web.openapi import document
from shardq.bin.web.state import Shared
from shardq.client.async_client import AsyncClient
from shardq.client.coalesce import SignalCoalescer
from shardq.core import tracing


def create_app(
    client: AsyncClient, tokens: list[tuple[str, str]], *, inbox_stale_after: float = 86400.0,
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]] | None = None,
) -> Starlette:
    """The API over `client`, for the tenants in `tokens`, and the review inbox (/inbox).
    `lifespan` opens and closes the client's pools around the signals still in flight."""
    signals = SignalCoalescer(client)

    @asynccontextmanager
    async def serving(app: Starlette) -> AsyncIterator[None]:
        async with lifespan(app) if lifespan is not None else nullcontext():
            try:
                yield
            finally:
                await signals.close()

    app = Starlette(routes=[*schedules.ROUTES, *api.ROUTES, *inbox.ROUTES, *explorer.ROUTES],
                    exception_handlers={404: _not_found, 405: _not_allowed}, lifespan=serving,
                    middleware=[Middleware(TraceContext)] if tracing.ENABLED else [])
    app.state.shared = Shared(client, signals, tokens, inbox_stale_after,
                              document(client.registry.names()))
    return app


class TraceContext:
    """Each request in a span that continues the caller's trace (its `traceparent`
    header, W3C Trace Context): a webhook's trace goes on into the signal it sends and
    the run it wakes (core/tracing.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or ()).get(b"traceparent")
        parent = header.decode("latin-1") if header else None
        with tracing.span(f"HTTP {scope['method']}", kind=tracing.SERVER, parent=parent,
                          attributes={"http.request.method": scope["method"],
                                      "url.path": scope["path"]}):
            await self.app(scope, receive, send)


async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": "no such route"}, 404)


async def _not_allowed(request: Request, exc: Exception) -> Response:
    allowed = getattr(exc, "headers", None) or {}
    return JSONResponse({"error": "method not allowed"}, 405, headers=allowed)
