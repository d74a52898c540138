"""A shard's schema as text, from the catalogs: what schema/current.sql shows a reader.

Tables with their columns, defaults and storage options, constraints, indexes,
views' columns (their queries are in the migrations, printed differently by
each PostgreSQL version) and function signatures (their bodies are
schema/functions/*.sql). Ordered by
name, so two shards that reached the same schema by different paths (migrated
from scratch, or upgraded release by release) print the same text.
"""

from __future__ import annotations

import psycopg

HEADER = """\
-- The schema every shard has once `shardq migrate` ran: tables, constraints,
-- indexes, views' columns and function signatures, printed from the catalogs of a shard
-- migrated from scratch. Generated, never edited: tests/migration/test_migrations.py
-- fails when the migrations and this picture disagree, and rewrites it with
--   SHARDQ_WRITE_SCHEMA=1 bash bin/test.sh tests/migration/test_migrations.py -k current
-- How it came to be: the numbered files beside it. Function bodies:
-- schema/functions/.
"""

_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid), a.attidentity
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE n.nspname = 'shardq' AND c.relkind = 'r'
ORDER BY c.relname, a.attnum
"""
_VIEW_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
WHERE n.nspname = 'shardq' AND c.relkind = 'v'
ORDER BY c.relname, a.attnum
"""
_TABLE_OPTIONS = """
SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'shardq' AND c.relkind = 'r'
"""
_CONSTRAINTS = """
SELECT c.relname, k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
-- NOT NULL is in the column lines; PostgreSQL 18 also lists it here (contype 'n'),
-- which would make the picture depend on the server's version.
WHERE n.nspname = 'shardq' AND k.contype <> 'n'
ORDER BY c.relname, k.conname
"""
_INDEXES = """
SELECT indexdef FROM pg_indexes i
WHERE schemaname = 'shardq' AND NOT EXISTS (
    SELECT 1 FROM pg_constraint k WHERE k.conname = i.indexname
      AND k.connamespace = 'shardq'::regnamespace)
ORDER BY tablename, indexname
"""
_FUNCTIONS = """
SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
       l.lanname, p.provolatile, coalesce(array_to_string(p.proconfig, ', '), '')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
JOIN pg_language l ON l.oid = p.prolang
WHERE n.nspname = 'shardq'
ORDER BY p.proname, pg_get_function_arguments(p.oid)
"""
_VOLATILITY = {"v": "VOLATILE", "s": "STABLE", "i": "IMMUTABLE"}


def describe(url: str) -> str:
    with psycopg.connect(url) as conn:
        columns = conn.execute(_COLUMNS).fetchall()
        options: dict[str, list[str] | None] = dict(conn.execute(_TABLE_OPTIONS).fetchall())
        constraints = conn.execute(_CONSTRAINTS).fetchall()
        indexes = conn.execute(_INDEXES).fetchall()
        functions = conn.execute(_FUNCTIONS).fetchall()
        view_columns = conn.execute(_VIEW_COLUMNS).fetchall()
    out = [HEADER]
    tables: dict[str, list[str]] = {}
    for table, name, kind, not_null, default, identity in columns:
        line = f"    {name} {kind}"
        if identity:
            line += " GENERATED " + ("ALWAYS" if identity == "a" else "BY DEFAULT") + \
                " AS IDENTITY"
        if not_null:
            line += " NOT NULL"
        if default is not None:
            line += f" DEFAULT {default}"
        tables.setdefault(table, []).append(line)
    for table in sorted(tables):
        storage = options.get(table)
        suffix = f" WITH ({', '.join(sorted(storage))})" if storage else ""
        out.append(f"CREATE TABLE shardq.{table} (\n" + ",\n".join(tables[table]) +
                   f"\n){suffix};\n")
    out.extend(
        f"ALTER TABLE shardq.{table} ADD CONSTRAINT {name} {definition};"
        for table, name, definition in constraints
    )
    out.append("")
    out.extend(f"{definition};" for (definition,) in indexes)
    out.append("")
    views: dict[str, list[str]] = {}
    for view, name, kind in view_columns:
        views.setdefault(view, []).append(f"{name} {kind}")
    out.extend(f"-- VIEW shardq.{view} ({', '.join(views[view])})" for view in sorted(views))
    out.append("")
    for name, arguments, result, language, volatility, config in functions:
        settings = f" SET {config}" if config else ""
        out.append(f"-- FUNCTION shardq.{name}({arguments})\n--   RETURNS {result}\n"
                   f"--   LANGUAGE {language} {_VOLATILITY[volatility]}{settings}")
    return "\n".join(out) + "\n"
