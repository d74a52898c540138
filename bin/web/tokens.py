"""Bearer tokens: made by `shardq api-token`, stored hashed, compared in constant time.

A tokens file holds one `TENANT sha256:HEX` per line; a token names its tenant,
and every route and inbox page sees only that tenant's runs.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from shardq.core.errors import InvalidArgument
from shardq.shards.errors import ConfigError


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "sq_" + secrets.token_urlsafe(32)


def load_tokens(path: Path) -> list[tuple[str, str]]:
    """(tenant, hashed token) pairs of a tokens file; ConfigError naming the bad line."""
    from shardq.core.rules import check_name

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read tokens file {path}: {exc}") from None
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()  # noqa: PLW2901 - the same line, without its blanks
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("sha256:") or len(parts[1]) != 71:
            raise ConfigError(f"{path}:{number}: expected `TENANT sha256:HEX` "
                              "(`shardq api-token TENANT` prints one)")
        try:
            check_name(parts[0], "tenant")
        except InvalidArgument as exc:
            raise ConfigError(f"{path}:{number}: {exc}") from None
        found.append((parts[0], parts[1]))
    if not found:
        raise ConfigError(f"{path}: no tokens: every request would be refused")
    return found


def tenant_for(presented: str, tokens: list[tuple[str, str]]) -> str | None:
    """The tenant of a presented token, or None; every entry is compared, so the time
    taken says nothing about which one matched."""
    digest = hash_token(presented.strip())
    tenant = None
    for candidate, stored in tokens:
        if hmac.compare_digest(digest, stored):
            tenant = candidate
    return tenant
