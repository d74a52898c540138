"""What a timed drain cost the database: its WAL, and each statement's time, blocks and WAL.

`DbMeter` brackets a timed window (started just before it opens, stopped once
the drain is over) and reports, per job:

- WAL bytes, always: the server's WAL insert position before and after
  (`pg_current_wal_insert_lsn()`), per server the shards live on. No extension
  needed. It is the whole server's WAL: other databases' writes in the window
  count too, as other processes' CPU shows in the CPU meter's `other_cpu_s`.
- WAL by resource manager (Heap, Btree, Transaction, ...), with its full-page
  images, where pg_walinspect (contrib, no preloading) can be created: Btree
  is index maintenance, Transaction the commit records. And by relation, from
  the same extension: which table and which index each byte went to, so an
  index a layout adds or drops shows by name.
- per statement, where the server preloads pg_stat_statements: the difference
  of two snapshots of its counters for the shards' databases (no reset: other
  users of the server keep theirs), grouped by statement: execution time,
  rows, shared blocks dirtied and written, WAL bytes, records and full-page
  images. pg_stat_statements times a function call whole (with the default
  `pg_stat_statements.track = top`): shardq's claim and commit are one
  statement each, everything inside them (their INSERTs, UPDATEs, DELETEs and
  the index maintenance each does) in its time. With `track = all` the
  statements inside appear too, marked nested (their time is already in their
  caller's). No statement's time holds the commit itself (its WAL flush comes
  after the statement ends) or parsing and the protocol; its time is wall
  time, waits included, not CPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from shardq.benchmarks.db import SQL, query

Row = dict[str, Any]

COUNTERS = ("calls", "total_exec_time", "total_plan_time", "rows", "shared_blks_hit",
            "shared_blks_read", "shared_blks_dirtied", "shared_blks_written", "wal_records",
            "wal_fpi", "wal_bytes")

LABELS = (
    ("shardq.claim_tasks(", "claim: shardq.claim_tasks()"),
    ("shardq.commit_turns_v2(", "commit: shardq.commit_turns_v2()"),
    ("UPDATE shardq_bench.q", "floor claim: UPDATE ... SKIP LOCKED"),
    ("DELETE FROM shardq_bench.q", "floor completion: DELETE"),
    ("FROM shardq.tasks WHERE run_at < now()", "the suite's progress poll (no job's)"),
)

OWN = ("FROM pg_stat_statements s", "pg_current_wal_insert_lsn()", "FROM pg_get_wal_stats(",
       "FROM pg_get_wal_records_info(")
"""The meter's own statements, left out of what it reports."""

SHOWN = 8
"""Statements listed per drain (top level, then nested), the rest summed into one line."""


@dataclass(frozen=True)
class Instruments:
    """What the shards' servers let the meter read beyond WAL positions."""

    statements: bool = False
    """pg_stat_statements is preloaded and created in every shard database."""
    wal_detail: bool = False
    """pg_walinspect is created in one shard database per server."""
    track: str | None = None
    """pg_stat_statements.track: `top` (functions timed whole) or `all` (nested too)."""


def servers(urls: Sequence[str]) -> dict[tuple[str, str], list[str]]:
    """The shard urls grouped by the server (host, port) they live on."""
    out: dict[tuple[str, str], list[str]] = {}
    for url in urls:
        info = conninfo_to_dict(url)
        key = (str(info.get("host") or info.get("hostaddr") or ""), str(info.get("port") or ""))
        out.setdefault(key, []).append(url)
    return out


def probe(urls: Sequence[str], log: Callable[[str], None]) -> Instruments:
    """Which instruments the shards' servers allow; one line for each that is missing."""
    statements, track = True, None
    for url in urls:
        preload = str(query(url, "server_facts")[0]["shared_preload_libraries"])
        if "pg_stat_statements" not in preload:
            log("no per-statement split: the server does not preload pg_stat_statements "
                f"(shared_preload_libraries = '{preload}'); WAL per job is measured without it")
            statements = False
            break
    if statements:
        try:
            for url in urls:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    row = conn.execute(
                        "SELECT current_setting('pg_stat_statements.track', true)").fetchone()
                    track = str(row[0]) if row else None
        except psycopg.Error as exc:
            log(f"no per-statement split: pg_stat_statements unusable ({exc})")
            statements = False
    wal_detail = True
    try:
        for group in servers(urls).values():
            with psycopg.connect(group[0], autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error as exc:
        log(f"no WAL by record type: pg_walinspect unavailable ({str(exc).strip()}); "
            "WAL bytes per job are measured without it")
        wal_detail = False
    return Instruments(statements, wal_detail, track if statements else None)


def label(text: str, toplevel: bool) -> str:
    """A statement's name in the report: shardq's and the floor's by role, others by text."""
    flat = re.sub(r"\s+", " ", re.sub(r"--[^\n]*", "", text)).strip()
    for needle, name in LABELS:
        if needle in flat:
            return name if toplevel else f"nested: {name}"
    return flat[:60] if toplevel else f"nested: {flat[:52]}"


class DbMeter:
    """Brackets a timed window: start() just before it opens, stop(jobs) once it is over."""

    def __init__(self, urls: Sequence[str], instruments: Instruments | None = None) -> None:
        self.groups = servers(urls)
        self.instruments = instruments or Instruments()
        self._conns: dict[tuple[str, str], psycopg.Connection[Row]] = {}
        self._lsn: dict[tuple[str, str], str] = {}
        self._dbids: dict[tuple[str, str], list[int]] = {}
        self._before: dict[tuple[Any, ...], Row] = {}

    def start(self) -> DbMeter:
        for server, group in self.groups.items():
            conn = psycopg.connect(group[0], autocommit=True, row_factory=dict_row,
                                   application_name="shardq-bench-meter")
            self._conns[server] = conn
            if self.instruments.statements:
                self._dbids[server] = [int(query(u, "database_oid")[0]["oid"]) for u in group]
        if self.instruments.statements:
            self._before = self._snapshot()
        # Last: nothing the meter does itself lands inside the window.
        for server, conn in self._conns.items():
            row = conn.execute(SQL["wal_insert_lsn"]).fetchone()
            assert row is not None
            self._lsn[server] = str(row["lsn"])
        return self

    def stop(self, jobs: int) -> Row:
        """`wal` (bytes per job, by resource manager where readable), `by_statement`."""
        try:
            ends = {server: conn.execute(SQL["wal_since"], {"start": self._lsn[server]}).fetchone()
                    for server, conn in self._conns.items()}
            after = self._snapshot() if self.instruments.statements else {}
            total = sum(int(e["bytes"]) for e in ends.values() if e)
            wal: Row = {"bytes": total, "bytes_per_job": _per(total, jobs),
                        "servers": len(self.groups)}
            if self.instruments.wal_detail:
                wal.update(self._by_rmgr(ends, jobs))
            out: Row = {"wal": wal}
            if self.instruments.statements:
                out["by_statement"] = split(self._before, after, jobs, self.instruments.track)
            return out
        finally:
            for conn in self._conns.values():
                conn.close()
            self._conns = {}

    def _snapshot(self) -> dict[tuple[Any, ...], Row]:
        rows: dict[tuple[Any, ...], Row] = {}
        for server, conn in self._conns.items():
            for found in conn.execute(SQL["statements_snapshot"],
                                      {"dbids": self._dbids[server]}).fetchall():
                r: Row = found["r"]
                key = (server, r.get("userid"), r.get("dbid"), r.get("queryid"),
                       r.get("toplevel", True))
                rows[key] = r
        return rows

    def _by_rmgr(self, ends: dict[tuple[str, str], Row | None], jobs: int) -> Row:
        try:
            by = self._grouped(SQL["wal_by_rmgr"], lambda r: str(r["rmgr"]), ends)
            names = self._relation_names()
            relations = self._grouped(SQL["wal_by_relation"], lambda r: names.get(
                (r["db"], r["filenode"]), "(outside the shards)" if r["db"] is not None
                else "(no relation: commit records and the like)"), ends)
        except psycopg.Error as exc:  # recycled already, or refused: say so in the result
            return {"by_rmgr_error": str(exc).strip()}
        records = sum(e["records"] for e in by.values())
        fpi = sum(e["fpi_bytes"] for e in by.values())
        return {
            "records_per_job": _per(records, jobs), "fpi_bytes_per_job": _per(fpi, jobs),
            "by_rmgr": _per_job(by, jobs), "by_relation": _per_job(relations, jobs),
        }

    def _relation_names(self) -> dict[tuple[int, int], str]:
        """(database oid, file node) -> relation name, in every shard database: the
        shards share one schema, so a name sums over them."""
        return {(int(r["db"]), int(r["filenode"])): str(r["relname"])
                for group in self.groups.values() for url in group
                for r in query(url, "relation_names")}

    def _grouped(self, statement: str, key: Callable[[Row], str],
                 ends: dict[tuple[str, str], Row | None]) -> dict[str, Row]:
        """The window's WAL grouped by `key` of the rows `statement` (one of queries.sql's)
        answers, summed over the servers."""
        by: dict[str, Row] = {}
        for server, conn in self._conns.items():
            end = ends.get(server)
            if not end or int(end["bytes"]) <= 0:
                continue
            for r in conn.execute(statement, {"start": self._lsn[server],
                                              "end": end["readable_end"]}).fetchall():
                entry = by.setdefault(key(r), {"records": 0, "bytes": 0, "fpi_bytes": 0})
                for k in ("records", "bytes", "fpi_bytes"):
                    entry[k] += int(r[k])
        return by


def _per_job(by: dict[str, Row], jobs: int) -> dict[str, Row]:
    """Each group with its bytes per job, the largest first."""
    return {name: {**e, "bytes_per_job": _per(e["bytes"], jobs)}
            for name, e in sorted(by.items(), key=lambda kv: -kv[1]["bytes"])}


def _per(value: float, jobs: int) -> float | None:
    return round(value / jobs, 1) if jobs else None


def _num(row: Row, key: str) -> float:
    value = row.get(key)
    return float(value) if value is not None else 0.0


def split(before: dict[tuple[Any, ...], Row], after: dict[tuple[Any, ...], Row], jobs: int,
          track: str | None) -> Row:
    """The statements of the window: counters after minus before, grouped by label."""
    grouped: dict[tuple[str, bool], Row] = {}
    for key, now in after.items():
        was = before.get(key, {})
        if _num(now, "calls") < _num(was, "calls"):  # reset meanwhile: all of it is new
            was = {}
        delta = {c: _num(now, c) - _num(was, c) for c in COUNTERS}
        if delta["calls"] <= 0:
            continue
        toplevel = bool(now.get("toplevel", True))
        text = str(now.get("query", ""))
        if any(needle in text for needle in OWN):
            continue
        name = label(text, toplevel)
        entry = grouped.setdefault((name, toplevel), {c: 0.0 for c in COUNTERS})
        for c in COUNTERS:
            entry[c] += delta[c]
    rows = [_row(name, toplevel, c, jobs) for (name, toplevel), c in grouped.items()]
    # Each statement's share of the time inside top-level statements: what the
    # report apportions PostgreSQL's CPU by (their times are wall times, waits included).
    inside = sum(r["exec_ms"] for r in rows if r["toplevel"])
    for r in rows:
        r["exec_share"] = round(r["exec_ms"] / inside, 3) if inside else None
    rows.sort(key=lambda r: (not r["toplevel"], -r["exec_ms"]))
    shown = [r for r in rows if r["toplevel"]][:SHOWN] + [r for r in rows if not r["toplevel"]][
        :SHOWN]
    rest = [r for r in rows if r not in shown and r["toplevel"]]
    top = [r for r in rows if r["toplevel"]]
    return {
        "track": track,
        "statements": shown,
        "more_statements": len(rest),
        "more_exec_us_per_job": _per(sum(1000 * r["exec_ms"] for r in rest), jobs),
        "toplevel_exec_us_per_job": _per(sum(1000 * r["exec_ms"] for r in top), jobs),
        "toplevel_wal_bytes_per_job": _per(sum(r["wal_bytes"] for r in top), jobs),
    }


def _row(name: str, toplevel: bool, c: Row, jobs: int) -> Row:
    out: Row = {
        "statement": name, "toplevel": toplevel, "calls": int(c["calls"]),
        "exec_ms": round(c["total_exec_time"], 2),
        "exec_us_per_job": _per(1000 * c["total_exec_time"], jobs),
        "rows": int(c["rows"]),
        "shared_blks_hit": int(c["shared_blks_hit"]),
        "shared_blks_read": int(c["shared_blks_read"]),
        "shared_blks_dirtied": int(c["shared_blks_dirtied"]),
        "shared_blks_written": int(c["shared_blks_written"]),
        "wal_bytes": int(c["wal_bytes"]), "wal_bytes_per_job": _per(c["wal_bytes"], jobs),
        "wal_records": int(c["wal_records"]), "wal_fpi": int(c["wal_fpi"]),
    }
    if c["total_plan_time"]:
        out["plan_us_per_job"] = _per(1000 * c["total_plan_time"], jobs)
    return out
