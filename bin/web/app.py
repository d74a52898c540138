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
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shardq.bin.web import api, inbox, schedules
from shardq.bin.web.openapi import document
from shardq.bin.web.state import Shared
from shardq.client.async_client import AsyncClient
from shardq.client.coalesce import SignalCoalescer


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

    app = Starlette(routes=[*schedules.ROUTES, *api.ROUTES, *inbox.ROUTES],
                    exception_handlers={404: _not_found, 405: _not_allowed}, lifespan=serving)
    app.state.shared = Shared(client, signals, tokens, inbox_stale_after,
                              document(client.registry.names()))
    return app


async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": "no such route"}, 404)


async def _not_allowed(request: Request, exc: Exception) -> Response:
    allowed = getattr(exc, "headers", None) or {}
    return JSONResponse({"error": "method not allowed"}, 405, headers=allowed)
