"""`shardq shards` status, add and remove, run as a user would: an empty shard added on a
separate PostgreSQL server and removed again, and one row per hostile input, each
refused in one line with its exit code and nothing stored."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import psycopg
import pytest

from shardq.shards.config import ShardMap
from shardq.shards.embedded import EmbeddedPostgres
from shardq.shards.migrations import migrate

from ..support import rows, run_cli

pytestmark = pytest.mark.slow
Fresh = Callable[..., list[str]]


@pytest.fixture(scope="module")
def other_server() -> Iterator[EmbeddedPostgres]:
    """A second PostgreSQL server (own data directory and socket): where a deployment
    grows to."""
    with EmbeddedPostgres() as server:  # started on entry
        yield server


@dataclass
class Deployment:
    urls: list[str]

    @property
    def env(self) -> dict[str, str]:
        return {"SHARDQ_SHARDS": ",".join(self.urls)}

    def cli(self, *args: str) -> Any:
        return run_cli(*args, env=self.env)


@pytest.fixture
def deployment(fresh_databases: Fresh) -> Deployment:
    urls = fresh_databases(2, "grow")
    migrate(ShardMap.from_urls(urls))
    return Deployment(urls)


def _versions(url: str) -> list[Any]:
    return rows(url, "SELECT (SELECT array_agg(version ORDER BY version) FROM shardq.shard_maps),"
                " map_version, deployment, bit_count(owned), bit_count(writable) "
                "FROM shardq.ownership")


def _ok(result: Any) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_add_then_remove_an_empty_shard_on_another_server(
    deployment: Deployment, other_server: EmbeddedPostgres,
) -> None:
    new_url = other_server.create_database(f"grown_{os.getpid()}")
    before = _ok(deployment.cli("--json", "shards", "status"))
    assert (before["version"], [s["ranges"] for s in before["shards"]]) == (
        1, [[[0, 2047]], [[2048, 4095]]])
    assert before["moves"] == []

    # An operator's settings every shard holds alike reach the new one too.
    _ok(deployment.cli("--json", "workflow", "set-build", "order", "b7", "--policy", "any"))
    added = _ok(deployment.cli("shards", "add", "shard-2", new_url, "--json"))
    assert (added["version"], added["shard"]) == (2, "shard-2")
    assert rows(new_url, "SELECT workflow_name, build_id, pinned FROM shardq.workflow_builds"
                ) == [("order", "b7", False)]
    assert [(s["name"], s["ranges"]) for s in added["shards"]] == [
        ("shard-0", [[0, 2047]]), ("shard-1", [[2048, 4095]]), ("shard-2", [])]
    # Version 2 on every shard, the new one included; it owns no bucket, same deployment.
    recorded = [_versions(url)[0] for url in [*deployment.urls, new_url]]
    assert [r[:2] for r in recorded] == [([1, 2], 2)] * 3
    assert len({r[2] for r in recorded}) == 1
    assert recorded[2][3:] == (0, 0)
    ((layout,),) = rows(new_url, "SELECT layout FROM shardq.shard_maps WHERE version = 2")
    assert layout["shards"][2] == {"name": "shard-2", "url": new_url}

    # A process started from the version-1 seeds sees version 2, the new shard reachable.
    status = _ok(deployment.cli("shards", "--json"))
    assert status["version"] == 2
    assert [(s["name"], s["ranges"], s["reachable"], s["map_version"], s["runs"], s["ok"])
            for s in status["shards"]] == [
        ("shard-0", [[0, 2047]], True, 2, 0, True), ("shard-1", [[2048, 4095]], True, 2, 0, True),
        ("shard-2", [], True, 2, 0, True)]
    text = deployment.cli("shards")
    assert text.returncode == 0 and text.stdout == deployment.cli("shards", "status").stdout
    assert "shard map version 2" in text.stdout and "no buckets" in text.stdout

    removed = _ok(deployment.cli("--json", "shards", "remove", "shard-2"))
    assert removed["version"] == 3
    assert [s["name"] for s in removed["shards"]] == ["shard-0", "shard-1"]
    assert [_versions(url)[0][:2] for url in [*deployment.urls, new_url]] == [
        ([1, 2, 3], 3)] * 3
    after = _ok(deployment.cli("--json", "shards"))
    assert (after["version"], [s["name"] for s in after["shards"]]) == (3, ["shard-0", "shard-1"])


def test_an_add_that_stopped_part_way_is_finished_by_running_it_again(
    deployment: Deployment, other_server: EmbeddedPostgres,
) -> None:
    """A map change writes its version shard by shard; one killed in between leaves a
    shard a version behind. The same command again finishes it (and any change does
    first), instead of refusing a name that exists already."""
    new_url = other_server.create_database(f"regrown_{os.getpid()}")
    _ok(deployment.cli("shards", "add", "shard-2", new_url, "--json"))
    def forget_version_2() -> None:
        """As if the command died after writing shard-0's version 2, before shard-1's."""
        rows(deployment.urls[1], "UPDATE shardq.ownership SET map_version = 1 RETURNING 1")
        rows(deployment.urls[1], "DELETE FROM shardq.shard_maps WHERE version = 2 RETURNING 1")

    forget_version_2()
    other = deployment.cli("shards", "add", "shard-2", "postgresql://127.0.0.1/elsewhere")
    assert other.returncode == 2 and "exists already" in other.stderr
    # The refused command above still finished the version first.
    assert _versions(deployment.urls[1])[0][:2] == ([1, 2], 2)
    forget_version_2()
    again = _ok(deployment.cli("shards", "add", "shard-2", new_url, "--json"))
    assert again["version"] == 2
    assert [_versions(url)[0][:2] for url in [*deployment.urls, new_url]] == [([1, 2], 2)] * 3


def test_status_with_the_home_shard_down_says_it_cannot_tell_about_moves(
    fresh_databases: Fresh,
) -> None:
    """The move journal is on the home shard: with it down, status said "no move in
    progress", and printed `None` in the down shard's columns."""
    (other,) = fresh_databases(1, "homeless")
    with EmbeddedPostgres() as home_server:
        home = home_server.create_database(f"home_{os.getpid()}")
        migrate(ShardMap.from_urls([home, other]))
    env = {"SHARDQ_SHARDS": f"{home},{other}"}  # the home server is stopped now
    text = run_cli("shards", "status", env=env)
    assert text.returncode == 3, text.stderr
    assert "no move in progress" not in text.stdout
    assert ("cannot tell whether a move is in progress: its journal is on the home shard "
            "shard-0, which is unreachable") in text.stdout
    (down,) = [line for line in text.stdout.splitlines() if "shard-0 " in line]
    assert "None" not in down and "unreachable" in down
    doc = json.loads(run_cli("--json", "shards", "status", env=env).stdout)
    assert doc["moves"] is None and "cannot tell" in doc["moves_problem"]
    assert [(s["name"], s["reachable"]) for s in doc["shards"]] == [
        ("shard-0", False), ("shard-1", True)]


def _socket_url_without_host(url: str) -> str:
    """`url` (the embedded server's: a Unix socket folder in `host=`) spelled as libpq's
    documentation spells a socket URL: no user, no host part, `postgresql:///db?...`."""
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    user = parts.username or "postgres"
    return (f"postgresql://{parts.path}?host={query['host']}&port={query['port']}"
            f"&user={user}")


def test_a_unix_socket_url_with_no_host_part_is_added_as_given(
    deployment: Deployment, other_server: EmbeddedPostgres,
) -> None:
    """`postgresql:///db?host=/run/postgresql` works in SHARDQ_SHARDS; `shards add` turned
    it into `postgresql:/db?...` (urlunsplit drops an empty host's `//`) and refused it."""
    new_url = _socket_url_without_host(
        other_server.create_database(f"socket_{os.getpid()}"))
    assert new_url.startswith("postgresql:///socket_")
    added = _ok(deployment.cli("--json", "shards", "add", "shard-2", new_url))
    assert added["shards"][2] == {"name": "shard-2", "url": new_url, "ranges": []}
    ((layout,),) = rows(deployment.urls[0],
                        "SELECT layout FROM shardq.shard_maps WHERE version = 2")
    assert layout["shards"][2]["url"] == new_url
    status = _ok(deployment.cli("--json", "shards", "status"))
    assert [(s["name"], s["reachable"], s["ok"]) for s in status["shards"]][2] == (
        "shard-2", True, True)


def _other_spelling(url: str) -> str:
    """The same database under another spelling of its server."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if "host" in query:  # a Unix socket folder: the same folder with a trailing slash
        query["host"] = [query["host"][0].rstrip("/") + "/"]
        return parts._replace(query=urlencode(query, doseq=True, safe="/")).geturl()
    return url.replace("127.0.0.1", "localhost", 1)


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    code: int
    message: str
    setup: str = ""
    """SQL run in the new database first: what it holds before the command."""


TABLE = "CREATE TABLE public.orders (id int PRIMARY KEY)"
CONFLICTING = "CREATE SCHEMA shardq; CREATE TABLE shardq.executions (id int)"


CASES = [
    Case("add-existing-name", ("add", "shard-1", "{new}"), 2, "shard shard-1 exists already"),
    Case("add-empty-name", ("add", "", "{new}"), 2, "shard name is empty"),
    Case("add-name-with-space", ("add", "shard 2", "{new}"), 2, "spaces or control characters"),
    Case("add-name-with-tab", ("add", "shard\t2", "{new}"), 2, "spaces or control characters"),
    Case("add-name-with-nul-like", ("add", "shard\x7f2", "{new}"), 2,
         "spaces or control characters"),
    Case("add-long-name", ("add", "s" * 300, "{new}"), 2, "300 characters long; at most 63"),
    Case("add-name-not-utf8", ("add", "shard-\udcff", "{new}"), 2, "is not valid UTF-8"),
    Case("add-url-with-password", ("add", "shard-2", "{with_password}"), 2,
         "carries a password: shard URLs are stored in every shard"),
    Case("add-url-password-in-query", ("add", "shard-2", "{password_query}"), 2,
         "passfile"),
    Case("add-url-not-postgresql", ("add", "shard-2", "mysql://h/db"), 2,
         "is not a PostgreSQL URL"),
    Case("add-url-no-database", ("add", "shard-2", "postgresql://127.0.0.1:5432"), 2,
         "names no database"),
    Case("add-url-of-a-shard", ("add", "shard-2", "{shard0}"), 2, "duplicate shard URL"),
    Case("add-url-of-a-shard-respelled", ("add", "shard-2", "{respelled}"), 2,
         "under another spelling"),
    Case("add-url-unreachable", ("add", "shard-2", "postgresql://postgres@127.0.0.1:1/x"), 3,
         "unreachable (connection refused)"),
    Case("add-url-no-such-database", ("add", "shard-2", "{missing}"), 3,
         "database does not exist"),
    Case("add-url-other-deployment", ("add", "shard-2", "{foreign}"), 4,
         "holds the shardq schema of deployment"),
    Case("add-url-other-deployment-allow-nonempty",
         ("add", "shard-2", "{foreign}", "--allow-nonempty"), 4,
         "holds the shardq schema of deployment"),
    Case("add-database-with-a-table", ("add", "shard-2", "{new}"), 2,
         "the database is not empty (schema public (2 relation(s), tables orders)): give an "
         "empty database, or --allow-nonempty", TABLE),
    Case("add-database-with-another-schema", ("add", "shard-2", "{new}"), 2,
         "the database is not empty (schema app (empty))", "CREATE SCHEMA app"),
    Case("add-database-with-a-function", ("add", "shard-2", "{new}"), 2,
         "schema public (1 function(s))",
         "CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1'"),
    Case("add-database-with-a-type", ("add", "shard-2", "{new}"), 2,
         "schema public (1 type(s))", "CREATE TYPE public.mood AS ENUM ('ok')"),
    # A shardq schema shardq did not make: migrating over it left three bookkeeping
    # tables behind and said "nothing of it applied".
    Case("add-conflicting-shardq-schema", ("add", "shard-2", "{new}"), 2,
         "holds a schema shardq (1 relation(s), tables executions) that no shardq deployment "
         "recorded", CONFLICTING),
    Case("add-conflicting-shardq-schema-allow-nonempty",
         ("add", "shard-2", "{new}", "--allow-nonempty"), 2,
         "that no shardq deployment recorded", CONFLICTING),
    Case("add-half-a-shardq-schema", ("add", "shard-2", "{new}"), 2,
         "that no shardq deployment recorded",
         "CREATE SCHEMA shardq; CREATE TABLE shardq.schema_migrations (version int)"),
    # Shards as schemas (shards/layout.py): `{new}` names its socket folder as a
    # query parameter already, so a schema is one more.
    Case("add-url-bad-schema", ("add", "shard-2", "{new}&schema=Shard2"), 2,
         "is not a lower-case identifier"),
    Case("add-url-schema-injection", ("add", "shard-2", "{new}&schema=s2;drop%20schema%20x"),
         2, "is not a lower-case identifier"),
    Case("add-url-two-schemas", ("add", "shard-2", "{new}&schema=a&schema=b"), 2,
         "names schema= 2 times"),
    Case("add-url-of-a-shard-its-schema-named", ("add", "shard-2", "{shard0_schema}"), 2,
         "duplicate shard URL"),
    Case("add-conflicting-named-schema", ("add", "shard-2", "{new}&schema=s2"), 2,
         "holds a schema s2 (1 relation(s), tables executions) that no shardq deployment "
         "recorded", "CREATE SCHEMA s2; CREATE TABLE s2.executions (id int)"),
    Case("add-allow-nonempty-with-a-value", ("add", "shard-2", "{new}", "--allow-nonempty=1"),
         2, "does not take a value"),
    Case("remove-unknown", ("remove", "shard-9"), 2, "unknown shard 'shard-9'"),
    Case("remove-home", ("remove", "shard-0"), 2, "shard-0 is the home shard"),
    Case("remove-owning-buckets", ("remove", "shard-1"), 2,
         "shard shard-1 owns buckets 2048-4095"),
    Case("status-extra-argument", ("status", "shard-0"), 2, "unexpected extra argument"),
    Case("unknown-subcommand", ("grow",), 2, "No such command 'grow'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_inputs_are_refused_in_one_line_and_store_nothing(
    case: Case, deployment: Deployment, other_server: EmbeddedPostgres, fresh_databases: Fresh,
) -> None:
    new = other_server.create_database(f"hostile_{case.name.replace('-', '_')}_{os.getpid()}")
    if case.setup:
        _run(new, case.setup)
    foreign = ""
    if "{foreign}" in case.args:  # another deployment's shard: made only where it is used
        (foreign,) = fresh_databases(1, "foreign")
        migrate(ShardMap.from_urls([foreign]))
    new_parts = urlsplit(new)
    values = {
        "new": new,
        "with_password": new.replace("postgres@", "postgres:s3cret@", 1),
        "password_query": f"{new}&password=s3cret",
        "shard0": deployment.urls[0],
        "shard0_schema": deployment.urls[0] + ("&" if "?" in deployment.urls[0] else "?")
        + "schema=shardq",
        "respelled": _other_spelling(deployment.urls[0]),
        "missing": new_parts._replace(path="/no_such_database_here").geturl(),
        "foreign": foreign,
    }
    args = tuple(a.format(**values) for a in case.args)
    watched = [*deployment.urls, *([foreign] if foreign else [])]
    before = [_versions(url) for url in watched]
    held = _relations(new)
    for as_json in (False, True):
        result = run_cli(*(["--json"] if as_json else []), "shards", *args, env=deployment.env)
        assert result.returncode == case.code, (result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        if as_json:
            error = json.loads(lines[0])
            assert error["code"] == case.code and case.message in error["error"], error
        else:
            assert lines[0].startswith("shardq: error: ") and case.message in lines[0], lines
        assert "s3cret" not in result.stderr
        assert [_versions(url) for url in watched] == before
        # The new database was not migrated, and holds what it held: nothing left behind.
        assert rows(new, "SELECT to_regclass('shardq.shard_maps')") == [(None,)]
        assert _relations(new) == held


def _run(url: str, statements: str) -> None:
    """Run SQL (several statements, no parameters) in a test's own database."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statements.encode())


def _relations(url: str) -> list[tuple[str, str]]:
    return [(str(a), str(b)) for a, b in rows(
        url, "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema',"
        " 'pg_toast') ORDER BY 1, 2")]


def test_allow_nonempty_adds_shardqs_schema_beside_what_the_database_holds(
    deployment: Deployment, other_server: EmbeddedPostgres,
) -> None:
    new_url = other_server.create_database(f"beside_{os.getpid()}")
    _run(new_url, TABLE + "; INSERT INTO public.orders VALUES (7)")
    refused = deployment.cli("shards", "add", "shard-2", new_url)
    assert refused.returncode == 2 and "--allow-nonempty" in refused.stderr
    added = _ok(deployment.cli("--json", "shards", "add", "shard-2", new_url,
                               "--allow-nonempty"))
    assert added["version"] == 2
    assert rows(new_url, "SELECT id FROM public.orders") == [(7,)]
    assert rows(new_url, "SELECT bit_count(owned) FROM shardq.ownership") == [(0,)]


def test_a_migration_that_fails_on_a_new_database_leaves_nothing_behind(
    deployment: Deployment, other_server: EmbeddedPostgres,
) -> None:
    """A migration refused part-way (here by an event trigger of the database's own)
    said "nothing of it applied" and left the schema and its bookkeeping tables."""
    new_url = other_server.create_database(f"refusing_{os.getpid()}")
    _run(new_url, """
        CREATE FUNCTION public.no_history() RETURNS event_trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands()
                     WHERE object_identity = 'shardq.history') THEN
            RAISE EXCEPTION 'no history tables here';
          END IF;
        END $$;
        CREATE EVENT TRIGGER no_history ON ddl_command_end EXECUTE FUNCTION public.no_history()
        """)
    held = _relations(new_url)
    failed = deployment.cli("shards", "add", "shard-2", new_url, "--allow-nonempty")
    assert failed.returncode == 6, failed.stderr
    (line,) = failed.stderr.strip().splitlines()
    assert "no history tables here" in line and "was left as it was found" in line
    assert rows(new_url, "SELECT to_regnamespace('shardq')") == [(None,)]
    assert _relations(new_url) == held
    assert _versions(deployment.urls[0]) == [([1], 1, _versions(deployment.urls[0])[0][2], 2048,
                                              2048)]
