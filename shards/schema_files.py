"""The files of `schema/`: what a shard's schema is made of, read from the package.

Numbered migrations (`NNNN_words.sql`) shape tables and indexes: each is applied
once, in order, and never edited after it shipped. Function files
(`functions/NAME.sql`, one `CREATE OR REPLACE` each) hold the current body of one
SQL function: a function is re-applied whenever its file changes, so a change to it
is a diff of one file, not a new copy in a new migration.

shards/migrations.py applies them; shards/check.py compares what a shard recorded
with them. Both read them here, so checking a shard never loads the migrator.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

from shardq.shards.errors import MigrationError
from shardq.shards.sqlfile import load_queries

SQL = load_queries("shardq.shards", "queries.sql")

CURRENT_SCHEMA_FILE = "current.sql"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_FUNCTION_FILE = re.compile(r"^([a-z][a-z0-9_]*)\.sql$")
# A migration may name the checksums of texts it replaces (`-- replaces
# checksum: ...`): a shard that applied one of those has applied it.
_REPLACES = re.compile(r"^-- replaces checksum: ([0-9a-f]{64})$", re.MULTILINE)


@dataclass(frozen=True)
class _SchemaFile:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class Migration(_SchemaFile):
    """A numbered migration (`NNNN_name.sql`): applied once, never edited after."""

    version: int

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"

    @property
    def bookkeeping(self) -> tuple[str, dict[str, Any]]:
        return SQL["record_migration"], {"version": self.version, "name": self.name,
                                         "checksum": self.checksum}

    def matches(self, recorded_checksum: str) -> bool:
        return recorded_checksum == self.checksum or recorded_checksum in _REPLACES.findall(
            self.sql
        )


@dataclass(frozen=True)
class Function(_SchemaFile):
    """The current body of one SQL function (`functions/NAME.sql`)."""

    @property
    def label(self) -> str:
        return f"functions/{self.name}.sql"

    @property
    def bookkeeping(self) -> tuple[str, dict[str, Any]]:
        return SQL["record_function"], {"name": self.name, "checksum": self.checksum}


@dataclass(frozen=True)
class Schema:
    migrations: list[Migration]
    functions: list[Function]

    @property
    def version(self) -> int:
        return self.migrations[-1].version if self.migrations else 0


def load_schema(directory: Path | Traversable | None = None) -> Schema:
    """The numbered migrations, in order, and the function files of a schema folder.

    A malformed file name or a gap in the numbering is an error.
    """
    folder = directory if directory is not None else resources.files("shardq.schema")
    migrations = []
    for entry in folder.iterdir():
        # current.sql is the generated picture of the whole schema, not a migration.
        if not entry.name.endswith(".sql") or entry.name == CURRENT_SCHEMA_FILE:
            continue
        match = _FILE.match(entry.name)
        if not match:
            raise MigrationError(f"{entry.name}: migration files are named NNNN_lower_words.sql")
        migrations.append(Migration(
            name=match[2], sql=entry.read_text(encoding="utf-8"), version=int(match[1])
        ))
    migrations.sort(key=lambda m: m.version)
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise MigrationError(f"migration {expected:04d} is missing before {migration.label}")
    functions = []
    function_folder = folder.joinpath("functions")
    if function_folder.is_dir():
        for entry in function_folder.iterdir():
            if not entry.name.endswith(".sql"):
                continue
            match = _FUNCTION_FILE.match(entry.name)
            if not match:
                raise MigrationError(f"functions/{entry.name}: function files are named "
                                     "lower_words.sql")
            functions.append(Function(name=match[1], sql=entry.read_text(encoding="utf-8")))
    functions.sort(key=lambda f: f.name)
    return Schema(migrations, functions)
