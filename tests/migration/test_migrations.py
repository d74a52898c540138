"""`shardq migrate` and `shardq shards` against real databases, run as processes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from shardq.client.client import Client
from shardq.shards.check import check_shard
from shardq.shards.config import ShardMap
from shardq.shards.errors import MigrationError
from shardq.shards.migrations import migrate
from shardq.shards.routing import new_execution_id
from shardq.shards.schema_files import CURRENT_SCHEMA_FILE, load_schema
from shardq.workflow.registry import Registry

from ..schema_picture import describe
from ..support import ROOT, rows, run_cli, schema_before

Fresh = Callable[[int], list[str]]


def _env(urls: list[str]) -> dict[str, str]:
    return {"SHARDQ_SHARDS": ",".join(urls)}


def _recorded(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT version, name FROM shardq.schema_migrations ORDER BY version"
        )]


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'shardq'")
        return {r[0] for r in rows}


def test_migrate_creates_every_table_on_every_shard_and_rerun_is_noop(
    fresh_databases: Fresh,
) -> None:
    urls = fresh_databases(2)
    first = run_cli("migrate", "--json", env=_env(urls))
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    schema = load_schema()
    everything = [m.version for m in schema.migrations]
    functions = [f.name for f in schema.functions]
    assert [s["applied"] for s in report["shards"]] == [everything, everything]
    assert [s["functions"] for s in report["shards"]] == [functions, functions]
    for url in urls:
        assert {"executions", "history", "tasks", "waits", "signals", "outbox"} <= _tables(url)
        assert _recorded(url) == [(m.version, m.name) for m in schema.migrations]
    again = run_cli("migrate", "--json", env=_env(urls))
    assert again.returncode == 0
    assert [(s["applied"], s["functions"]) for s in json.loads(again.stdout)["shards"]] == [
        ([], []), ([], [])
    ]


def test_queue_tables_carry_churn_settings(fresh_databases: Fresh) -> None:
    urls = fresh_databases(1)
    assert run_cli("migrate", env=_env(urls)).returncode == 0
    with psycopg.connect(urls[0]) as conn:
        options = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'shardq.tasks'::regclass"
        ).fetchone()
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'shardq' AND tablename = 'tasks'"
        ).fetchall()
    assert options is not None
    assert "fillfactor=50" in options[0]
    assert "autovacuum_vacuum_scale_factor=0.01" in options[0]
    # tasks_urgent is partial: a task of priority 0, the default, never enters it;
    # tasks_fair holds only those (schema/0021). Pinned rows have indexes of their own
    # (schema/0026).
    assert sorted(i[0] for i in indexes) == [
        "tasks_due", "tasks_fair", "tasks_pinned", "tasks_pinned_urgent", "tasks_pkey",
        "tasks_urgent"]


def test_racing_migrators_apply_each_file_once(fresh_databases: Fresh) -> None:
    urls = fresh_databases(2)
    env = {**_env(urls)}
    cmd = [sys.executable, "-m", "shardq.bin.cli", "migrate", "--json"]
    procs = [
        subprocess.Popen(cmd, env={**_base_env(), **env}, cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    applied = [
        [s["applied"] for s in json.loads(out)["shards"]] for out, _ in outputs
    ]
    # Across the racers each shard's files were applied exactly once.
    expected = [(m.version, m.name) for m in load_schema().migrations]
    for shard_index in range(2):
        assert sorted(v for a in applied for v in a[shard_index]) == [v for v, _ in expected]
    for url in urls:
        assert _recorded(url) == expected
    # One racer minted the deployment on the first shard; the others took it from there.
    assert len({tuple(rows(url, "SELECT deployment FROM shardq.ownership")) for url in urls}) == 1


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}


def test_failing_migration_leaves_nothing_of_itself(fresh_databases: Fresh, tmp_path: Path) -> None:
    urls = fresh_databases(1)
    folder = tmp_path / "schema"
    folder.mkdir()
    shutil.copy(ROOT / "schema" / "0001_initial.sql", folder)
    (folder / "0002_broken.sql").write_text(
        "CREATE TABLE shardq.half_done (id int);\n"
        "ALTER TABLE shardq.no_such_table ADD COLUMN x int;\n"
    )
    result = run_cli("migrate", "--schema-dir", str(folder), env=_env(urls))
    assert result.returncode == 6
    assert result.stderr.count("\n") == 1
    assert "shard-0" in result.stderr
    assert "0002_broken.sql failed, nothing of it applied" in result.stderr
    assert "no_such_table" in result.stderr
    assert "half_done" not in _tables(urls[0])
    assert _recorded(urls[0]) == [(1, "initial")]


def test_edited_migration_is_refused(fresh_databases: Fresh, tmp_path: Path) -> None:
    urls = fresh_databases(1)
    assert run_cli("migrate", env=_env(urls)).returncode == 0
    folder = tmp_path / "schema"
    folder.mkdir()
    text = (ROOT / "schema" / "0001_initial.sql").read_text()
    (folder / "0001_initial.sql").write_text(text + "\n-- edited\n")
    result = run_cli("migrate", "--schema-dir", str(folder), env=_env(urls))
    assert result.returncode == 6
    assert "was edited after it was applied" in result.stderr


def test_shard_migrated_with_another_map_is_refused(fresh_databases: Fresh) -> None:
    a, b, c = fresh_databases(3)
    assert run_cli("migrate", env=_env([a, b])).returncode == 0
    # Same databases listed in the other order: each would take the other's buckets.
    swapped = run_cli("shards", env=_env([b, a]))
    assert swapped.returncode == 4
    assert "recorded as shard-1, this map calls it shard-0" in swapped.stdout
    grown = run_cli("migrate", env=_env([a, b, c]))
    assert grown.returncode == 4
    assert grown.stderr.startswith("shardq: error: shard-0")
    assert "migrated with a 2-shard map, this one has 3" in grown.stderr
    # The refusal happened before anything was applied to the new database.
    assert "executions" not in _tables(c)


def test_shards_command_reports_each_shard(fresh_databases: Fresh) -> None:
    urls = fresh_databases(2)
    assert run_cli("migrate", env=_env(urls)).returncode == 0
    result = run_cli("--json", "shards", env=_env(urls))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["fingerprint"] == ShardMap.from_urls(urls).fingerprint
    assert [(s["name"], s["buckets"], s["schema_version"], s["ok"]) for s in report["shards"]] == [
        ("shard-0", [0, 2047], load_schema().version, True),
        ("shard-1", [2048, 4095], load_schema().version, True),
    ]


def test_unreachable_shard_is_named(fresh_databases: Fresh) -> None:
    (good,) = fresh_databases(1)
    dead = "postgresql://postgres@127.0.0.1:1/nowhere"
    assert run_cli("migrate", "--shard", "shard-0", env=_env([good, dead])).returncode == 0
    result = run_cli("--json", "shards", env=_env([good, dead]))
    assert result.returncode == 3
    report = json.loads(result.stdout)
    assert report["shards"][0]["ok"] is True
    assert report["shards"][1]["problem"] == "unreachable (connection refused)"
    migrating = run_cli("migrate", env=_env([good, dead]))
    assert migrating.returncode == 3
    assert migrating.stderr.strip() == (
        "shardq: error: shard-1 (postgresql://postgres@127.0.0.1:1/nowhere): "
        "unreachable (connection refused)"
    )


def test_missing_database_and_schema_behind_are_named(
    fresh_databases: Fresh, tmp_path: Path
) -> None:
    (url,) = fresh_databases(1)
    parts = urlsplit(url)
    gone = urlunsplit(parts._replace(path="/shardq_no_such_db"))
    missing = run_cli("shards", env=_env([gone]))
    assert missing.returncode == 3
    assert "database does not exist" in missing.stdout
    empty = tmp_path / "none"
    empty.mkdir()
    assert run_cli("migrate", "--schema-dir", str(empty), env=_env([url])).returncode == 0
    behind = run_cli("shards", env=_env([url]))
    assert behind.returncode == 5
    assert f"schema behind: version 0, this code needs {load_schema().version}" in behind.stdout


def test_a_gap_in_the_numbering_is_refused(tmp_path: Path) -> None:
    shutil.copy(ROOT / "schema" / "0001_initial.sql", tmp_path)
    (tmp_path / "0003_later.sql").write_text("SELECT 1;\n")
    with pytest.raises(MigrationError, match=r"migration 0002 is missing before 0003_later\.sql"):
        load_schema(tmp_path)


CURRENT = ROOT / "schema" / CURRENT_SCHEMA_FILE


def test_the_current_schema_is_what_the_migrations_build(fresh_databases: Fresh) -> None:
    (url,) = fresh_databases(1)
    migrate(ShardMap.from_urls([url]))
    picture = describe(url)
    if os.environ.get("SHARDQ_WRITE_SCHEMA"):
        CURRENT.write_text(picture)
    assert picture == CURRENT.read_text(), (
        "schema/current.sql is out of date: rerun with SHARDQ_WRITE_SCHEMA=1 and review the diff"
    )


def test_a_shard_from_before_function_files_upgrades_to_the_same_schema(
    fresh_databases: Fresh,
) -> None:
    # Such a shard recorded the original texts of the migrations whose function
    # bodies later moved to schema/functions/, and has no function bookkeeping.
    (url,) = fresh_databases(1)
    shard_map = ShardMap.from_urls([url])
    migrate(shard_map)
    schema = load_schema()
    with psycopg.connect(url) as conn:
        for migration in schema.migrations:
            old = re.findall(r"^-- replaces checksum: (\w+)$", migration.sql, re.MULTILINE)
            if old:
                conn.execute("UPDATE shardq.schema_migrations SET checksum = %s "
                             "WHERE version = %s", (old[0], migration.version))
        conn.execute("DROP TABLE shardq.schema_functions")
    (result,) = migrate(shard_map)
    assert (result.applied, result.functions) == ([], [f.name for f in schema.functions])
    assert check_shard(shard_map, shard_map.shards[0]).problem is None
    assert describe(url) == CURRENT.read_text()


def test_a_changed_function_is_reapplied_and_never_rolled_back(
    fresh_databases: Fresh, tmp_path: Path
) -> None:
    (url,) = fresh_databases(1)
    shard_map = ShardMap.from_urls([url])
    shard = shard_map.shards[0]
    migrate(shard_map)
    newer = tmp_path / "schema"
    shutil.copytree(ROOT / "schema", newer)
    body = newer / "functions" / "claim_tasks.sql"
    marked = body.read_text().replace("#variable_conflict", "-- release 2\n#variable_conflict")
    body.write_text(marked)
    assert "release 2" in body.read_text()
    newer_schema = load_schema(newer)
    problem = check_shard(shard_map, shard, schema=newer_schema).problem
    assert problem == "schema behind: functions/claim_tasks.sql not applied (run `shardq migrate`)"

    (result,) = migrate(shard_map, schema=newer_schema)
    assert (result.applied, result.functions) == ([], ["claim_tasks"])
    # The release before it still runs against this shard, and its migrator
    # finds its own body applied already: it never puts it back.
    assert check_shard(shard_map, shard).problem is None
    (older,) = migrate(shard_map)
    assert older.functions == []
    with psycopg.connect(url) as conn:
        source = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = 'claim_tasks'"
        ).fetchone()
    assert source is not None and "release 2" in source[0]


def test_runs_written_before_state_moved_to_narrow_rows_read_the_same(
    fresh_databases: Fresh, tmp_path: Path
) -> None:
    (url,) = fresh_databases(1)
    before = tmp_path / "schema"
    before.mkdir()
    for path in sorted((ROOT / "schema").glob("000[1-4]_*.sql")):
        shutil.copy(path, before)
    shard_map = ShardMap.from_urls([url])
    migrate(shard_map, schema=load_schema(before))
    ids = {name: new_execution_id(7) for name in
           ("done", "broke", "stopped", "parked", "busy", "queued", "woken")}
    finished = "2026-01-02T03:04:05+00:00"
    with psycopg.connect(url) as conn:
        # Rows as the release before left them: state, output and error on executions.
        for name, state, output, error, cancel in [
            ("done", "completed", '{"x": 1}', None, False),
            ("broke", "failed", None, '{"type": "ValueError"}', False),
            ("stopped", "cancelled", None, None, True),
            ("parked", "waiting", None, None, False),
            ("busy", "running", None, None, True),
            ("queued", "pending", None, None, False),
            ("woken", "waiting", None, None, False),
        ]:
            ended = finished if state in ("completed", "failed", "cancelled") else None
            conn.execute(
                "INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version, "
                "workflow_id, state, input, output, error, cancel_requested, finished_at) "
                "VALUES (%s, 'default', 'wf', 1, %s, %s, '{}', %s, %s, %s, %s)",
                (ids[name], name, state, output, error, cancel, ended),
            )
        conn.execute("INSERT INTO shardq.waits (execution_id, position, kind, name) "
                     "VALUES (%s, 0, 'signal', 'go'), (%s, 0, 'signal', 'go')",
                     (ids["parked"], ids["woken"]))
        conn.execute("INSERT INTO shardq.tasks (execution_id, run_at, claims, lease_owner, "
                     "lease_token) VALUES (%s, now() + interval '1 hour', 1, 'w', %s), "
                     "(%s, now(), 0, NULL, NULL), (%s, now(), 0, NULL, NULL)",
                     (ids["busy"], uuid.uuid4(), ids["queued"], ids["woken"]))
    migrate(shard_map)
    with Client.connect(shard_map, Registry()) as client:
        runs = {name: client.get(ident) for name, ident in ids.items()}
    assert {n: r.state.value for n, r in runs.items()} == {
        "done": "completed", "broke": "failed", "stopped": "cancelled", "parked": "waiting",
        "busy": "running", "queued": "pending", "woken": "waiting",
    }
    assert runs["done"].output == {"x": 1} and runs["broke"].error == {"type": "ValueError"}
    assert {n for n, r in runs.items() if r.finished_at is not None} == {
        "done", "broke", "stopped"
    }
    assert runs["done"].finished_at == datetime.fromisoformat(finished)
    assert [n for n, r in runs.items() if r.cancel_requested] == ["busy"]
    # The woken run's task row is not its first: its next claim reads its history.
    assert rows(url, "SELECT claims FROM shardq.tasks WHERE execution_id = %s",
                ids["woken"]) == [(1,)]
    # Task rows take their run's tenant (schema/0021): fair claims find them by it.
    assert rows(url, "SELECT DISTINCT tenant FROM shardq.tasks") == [("default",)]
    assert describe(url) == CURRENT.read_text()


# The functions migration 0013 drops or re-creates, as a shard migrated before
# it has them: the signatures and answers are theirs, the bodies stand-ins.
_BEFORE_0013 = {
    "commit_turns": """
CREATE OR REPLACE FUNCTION shardq.commit_turns(lease_s float8, batch jsonb)
RETURNS TABLE (commit_ord integer, cancel_requested boolean, externals jsonb)
LANGUAGE sql AS $$ SELECT 1, false, NULL::jsonb WHERE false $$;
""",
    "signal_with_start": """
CREATE OR REPLACE FUNCTION shardq.signal_with_start(
    p_tenant text, p_workflow_name text, p_workflow_version integer, p_workflow_id text,
    p_new_id uuid, p_input jsonb, p_name text, p_payload jsonb, p_key text,
    p_max_pending integer, p_max_pending_total integer
) RETURNS TABLE (execution_id uuid, created boolean, tenant text, finished text,
                 earlier_id bigint, earlier_name text, pending bigint, pending_total bigint,
                 signal_id bigint)
LANGUAGE sql AS $$ SELECT NULL::uuid, false, '', '', 1::bigint, '', 0::bigint, 0::bigint,
                          1::bigint WHERE false $$;
""",
    "signal_with_start_v2": """
CREATE OR REPLACE FUNCTION shardq.signal_with_start_v2(
    p_tenant text, p_workflow_name text, p_workflow_version integer, p_workflow_id text,
    p_new_id uuid, p_input jsonb, p_name text, p_payload jsonb, p_key text,
    p_max_pending integer, p_max_pending_total integer, p_gates text[]
) RETURNS TABLE (execution_id uuid, created boolean, tenant text, finished text,
                 earlier_id bigint, earlier_name text, pending bigint, pending_total bigint,
                 signal_id bigint, gate_closed boolean)
LANGUAGE sql AS $$ SELECT NULL::uuid, false, '', '', 1::bigint, '', 0::bigint, 0::bigint,
                          1::bigint, false WHERE false $$;
""",
    "deliver_signals": """
CREATE OR REPLACE FUNCTION shardq.deliver_signals(
    p_tenant text, p_ids uuid[], p_names text[], p_payloads jsonb[], p_keys text[],
    p_max_pending integer, p_max_pending_total integer, p_origins text[]
) RETURNS TABLE (ord integer, tenant text, finished text, earlier_id bigint,
                 earlier_name text, pending bigint, pending_total bigint, signal_id bigint,
                 woken bigint, gate_closed boolean)
LANGUAGE sql AS $$ SELECT 1, '', '', 1::bigint, '', 0::bigint, 0::bigint, 1::bigint,
                          0::bigint, false WHERE false $$;
CREATE OR REPLACE FUNCTION shardq.deliver_signals(
    p_tenant text, p_ids uuid[], p_names text[], p_payloads jsonb[], p_keys text[],
    p_max_pending integer, p_max_pending_total integer
) RETURNS TABLE (ord integer, tenant text, finished text, earlier_id bigint,
                 earlier_name text, pending bigint, pending_total bigint, signal_id bigint,
                 woken bigint)
LANGUAGE sql AS $$ SELECT 1, '', '', 1::bigint, '', 0::bigint, 0::bigint, 1::bigint,
                          0::bigint WHERE false $$;
""",
}


def _functions(url: str) -> set[tuple[str, str]]:
    return set(rows(url, "SELECT proname::text, pg_get_function_identity_arguments(oid) "
                    "FROM pg_proc WHERE pronamespace = 'shardq'::regnamespace"))


def test_a_shard_from_before_the_wrappers_retired_ends_with_exactly_the_current_functions(
    fresh_databases: Fresh, tmp_path: Path
) -> None:
    """A function whose file is gone stays on a shard until a migration drops it."""
    (url, fresh_url) = fresh_databases(2)
    before = schema_before(ROOT / "schema", tmp_path / "schema", 13,
                           ["signal_refusal", "bucket", "fence"])
    for name, sql in _BEFORE_0013.items():
        (before / "functions" / f"{name}.sql").write_text(sql)
    shard_map = ShardMap.from_urls([url])
    migrate(shard_map, schema=load_schema(before))
    assert {"commit_turns", "signal_with_start"} <= {name for name, _ in _functions(url)}

    schema = load_schema()
    (result,) = migrate(shard_map, schema=schema)
    assert result.applied == list(range(13, schema.version + 1))
    # claim_tasks is not among them: the old shard was given today's body, whose
    # arguments no migration's DROP names. child_docs is: migration 0027 drops it.
    assert sorted(result.functions) == ["bucket", "child_docs", "deliver_signals", "fence",
                                        "finish_tasks", "signal_refusal",
                                        "signal_with_start_v2"]
    migrate(ShardMap.from_urls([fresh_url]))
    assert _functions(url) == _functions(fresh_url)
    assert {name for name, _ in _functions(url)} == {f.name for f in schema.functions}
    assert check_shard(shard_map, shard_map.shards[0]).problem is None
    assert describe(url) == CURRENT.read_text()
