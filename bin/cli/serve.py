"""`shardq serve`, the HTTP API and the review inbox (bin/web/), and `shardq api-token`,
which makes the bearer tokens they take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from shardq.bin.cli.common import (
    Seconds,
    Settings,
    app_option,
    emit,
    errors_as_exit_codes,
    json_option,
    pass_settings,
)
from shardq.shards.errors import ConfigError


@click.command("api-token")
@json_option
@click.argument("tenant")
@pass_settings
def api_token(settings: Settings, tenant: str) -> None:
    """Make a bearer token for TENANT: the token once, and its line for the tokens file."""
    from shardq.bin.web.tokens import hash_token, new_token
    from shardq.core.rules import check_name

    with errors_as_exit_codes():
        check_name(tenant, "tenant")
    token = new_token()
    line = f"{tenant} {hash_token(token)}"
    emit(settings, {"tenant": tenant, "token": token, "tokens_file_line": line},
         f"token (shown once): {token}\nadd to the tokens file: {line}")


@click.command("serve")
@app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--tokens-file", required=True, envvar="SHARDQ_TOKENS_FILE",
              type=click.Path(path_type=Path, dir_okay=False),
              help="`TENANT sha256:HEX` per line (shardq api-token) [env SHARDQ_TOKENS_FILE]")
@click.option("--inbox-stale-after", default=86400.0, show_default=True,
              type=Seconds(),
              help="Seconds after which the inbox marks an open interrupt stale.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes sharing the port, each with its own pools.")
@pass_settings
def serve_command(
    settings: Settings, app: str | None, host: str, port: int, tokens_file: Path,
    inbox_stale_after: float, workers: int,
) -> None:
    """Serve the HTTP management API under /api/shardq and the review inbox under /inbox
    until SIGTERM."""
    import os
    import socket

    import uvicorn

    from shardq.bin.web.serving import ENV_CONFIG, ServeConfig, build_app, checked

    config = ServeConfig(app, str(tokens_file), settings.shards,
                         str(settings.shards_file) if settings.shards_file else None,
                         inbox_stale_after)
    with errors_as_exit_codes():
        # Every process would refuse the same way: checked once, here, in one line.
        checked(config)
        try:  # refused here, in one line, rather than by uvicorn's own logging
            with socket.create_server((host, port)):
                pass
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    options: dict[str, Any] = {"host": host, "port": port, "log_level": "warning",
                               "access_log": False, "server_header": False}
    # The two places a newcomer goes next; an IPv6 address needs its brackets in a URL.
    origin = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    click.echo(f"shardq API on {origin}/api/shardq\ninbox at {origin}/inbox", err=True)
    if workers == 1:
        with errors_as_exit_codes():
            application = build_app(config)
        uvicorn.run(application, **options)
    else:
        os.environ[ENV_CONFIG] = config.to_env()
        uvicorn.run("shardq.bin.web.serving:app_from_environment", factory=True, workers=workers,
                    **options)


COMMANDS = [api_token, serve_command]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""
