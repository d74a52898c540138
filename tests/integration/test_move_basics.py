"""Moving a bucket range between two PostgreSQL servers (shardq.moves): what moves, and how.

Source and target are separate servers (shards/embedded.py), as in a deployment
that grows. Runs are written by SQL into the six tables, so every kind of row
(leased tasks, timers, interrupts, consumed and pending signals with keys and
origins, outbox rows sent) is there on purpose; the helpers here also serve
tests/acceptance/test_move_crashes.py.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click
import psycopg
import pytest
from click.testing import CliRunner

from shardq.bin.cli import moves as move_cli
from shardq.bin.cli.common import Settings
from shardq.client.client import Client
from shardq.core.flow import ConcurrencyLimit
from shardq.moves import deployment as move_deployment
from shardq.moves import mover
from shardq.moves.models import MoveOptions, MoveResult
from shardq.moves.plan import parse_range, plan_batches, plan_rebalance, reassign
from shardq.moves.store import COPIES
from shardq.shards.config import ShardMap
from shardq.shards.embedded import EmbeddedPostgres
from shardq.shards.errors import ConfigError, MoveRunning
from shardq.shards.migrations import migrate
from shardq.shards.routing import BUCKETS, bucket_for_key, bucket_of, new_execution_id
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

SIX = ("executions", "history", "signals", "waits", "tasks", "outbox")
MOVED = (1024, 1535)  # inside shard-0's 0..2047 of a two-shard map
KEYED = Registry()


@KEYED.workflow("keyed")
def keyed(ctx: WorkflowContext) -> None:
    """Started, never run here: its runs are rows a move carries."""


@dataclass
class Deployment:
    seeds: ShardMap
    urls: list[str]

    def env(self) -> dict[str, str]:
        return {"SHARDQ_SHARDS": ",".join(self.urls)}


@contextlib.contextmanager
def two_servers() -> Iterator[Deployment]:
    """A deployment of two fresh shards on two embedded servers of its own, stopped after:
    the module-scoped `base` of every module that moves buckets between servers."""
    started = [EmbeddedPostgres().start(), EmbeddedPostgres().start()]
    try:
        yield new_deployment(started)
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def base() -> Iterator[Deployment]:
    with two_servers() as deployment:
        yield deployment


@pytest.fixture
def deployment(base: Deployment) -> Deployment:
    """The module's two shards, back at map version 1 with no runs and no moves."""
    reset(base)
    return base


def new_deployment(servers: list[EmbeddedPostgres]) -> Deployment:
    """Two fresh shards, one per server, migrated: shard-0 owns 0-2047 and is home."""
    tag = uuid.uuid4().hex[:8]
    urls = [s.create_database(f"mv_{tag}_{i}") for i, s in enumerate(servers)]
    seeds = ShardMap.from_urls(urls)
    migrate(seeds)
    return Deployment(seeds, urls)


def reset(dep: Deployment) -> None:
    """Version 1 again, as `migrate` left it: cheaper than migrating new databases."""
    half = BUCKETS // len(dep.urls)
    for i, url in enumerate(dep.urls):
        owned = "0" * (half * i) + "1" * half + "0" * (BUCKETS - half * (i + 1))
        with psycopg.connect(url, autocommit=True) as conn:
            # Ends the sessions a killed mover left (an orphaned switch, a lock).
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE datname = current_database() AND pid <> pg_backend_pid()")
            conn.execute("TRUNCATE " + ", ".join(f"shardq.{t}" for t in COPIES)
                         + ", shardq.applied_batches, shardq.move_batches, shardq.moves"
                         " RESTART IDENTITY")
            conn.execute("UPDATE shardq.ownership SET map_version = 1, owned = %s::bit(4096),"
                         " writable = %s::bit(4096), unclean = false, fence_move = NULL,"
                         " fence_target = NULL", (owned, owned))
            conn.execute("DELETE FROM shardq.shard_maps WHERE version > 1")


# -- writing runs ---------------------------------------------------------------------


def add_runs(url: str, buckets: list[int], *, prefix: str, target_of_sends: uuid.UUID
             ) -> list[uuid.UUID]:
    """One run per bucket with every kind of row, the kinds rotating by index."""
    ids = []
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for i, bucket in enumerate(buckets):
            run = new_execution_id(bucket)
            ids.append(run)
            conn.execute(
                "INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version,"
                " workflow_id, input, gates) VALUES (%s, 'default', 'mv', 1, %s, %s, %s)",
                (run, f"{prefix}-{i}", json.dumps({"i": i}), ["g"] if i % 5 == 0 else None))
            for position in range(3):
                conn.execute(
                    "INSERT INTO shardq.history (execution_id, position, kind, name, payload)"
                    " VALUES (%s, %s, 'step.completed', 's', %s)",
                    (run, position, json.dumps({"p": position})))
            kind = ("timer", "signal", "interrupt", "condition")[i % 4]
            conn.execute(
                "INSERT INTO shardq.waits (execution_id, position, kind, name, deadline,"
                " request) VALUES (%s, 3, %s, 'w', CASE WHEN %s = 'timer' THEN"
                " now() + interval '90 days' END, %s)",
                (run, kind, kind, json.dumps({"prompt": "ok?"}) if kind == "interrupt" else None))
            leased = i % 3 == 0
            conn.execute(
                "INSERT INTO shardq.tasks (execution_id, run_at, claims, lease_owner, lease_token)"
                " VALUES (%s, now() + interval '1 hour', %s, %s, %s)",
                (run, 2 if leased else 0, "w-1" if leased else None,
                 uuid.uuid4() if leased else None))
            conn.execute(
                "INSERT INTO shardq.signals (execution_id, tenant, name, payload,"
                " idempotency_key, consumed_at, consumed_position)"
                " VALUES (%s, 'default', 'paid', '1', %s, now(), 1)",
                (run, f"{prefix}-key-{i}"))
            conn.execute(
                "INSERT INTO shardq.signals (execution_id, tenant, name, payload, idempotency_key,"
                " origin) VALUES (%s, 'default', 'paid', '2', %s, %s)",
                (run, f"{prefix}-key2-{i}", f"{uuid.uuid4()}/7"))
            if i % 2 == 0:  # search attributes, a text one and a number
                conn.execute(
                    "INSERT INTO shardq.run_attributes (execution_id, name, tenant, value)"
                    " VALUES (%s, 'region', 'default', '\"eu\"'), (%s, 'amount', 'default', %s)",
                    (run, run, json.dumps(i * 1.5)))
            for position in (4, 5):
                conn.execute(
                    "INSERT INTO shardq.outbox (source_execution_id, source_position,"
                    " target_execution_id, tenant, signal_name, payload, target_bucket)"
                    " VALUES (%s, %s, %s, 'default', 'hello', %s, %s)",
                    (run, position, target_of_sends, json.dumps({"n": position}),
                     bucket_of(target_of_sends)))
    return ids


def populate(dep: Deployment, moved: int = 24, kept: int = 8) -> tuple[list[uuid.UUID],
                                                                        list[uuid.UUID]]:
    """Runs in MOVED and outside it on shard-0, and a few of shard-1's own first, so the
    target's sequences are ahead of nothing in particular."""
    other = new_execution_id(3000)
    add_runs(dep.urls[1], [3000 + i for i in range(5)], prefix="b", target_of_sends=other)
    lo, hi = MOVED
    inside = [lo + (i * 37) % (hi - lo + 1) for i in range(moved)]
    outside = [i * 97 % lo for i in range(kept)]
    return (add_runs(dep.urls[0], inside, prefix="in", target_of_sends=other),
            add_runs(dep.urls[0], outside, prefix="out", target_of_sends=other))


# -- reading what is where -----------------------------------------------------------------


def dump(url: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, list[tuple[Any, ...]]]]:
    """Every row of each run, per table; outbox rows without their (renumbered) id, in id order."""
    queries = {
        "executions": "SELECT * FROM shardq.executions WHERE id = %s",
        "history": "SELECT * FROM shardq.history WHERE execution_id = %s ORDER BY seq",
        "signals": "SELECT * FROM shardq.signals WHERE execution_id = %s ORDER BY id",
        "waits": "SELECT * FROM shardq.waits WHERE execution_id = %s",
        "run_attributes": "SELECT * FROM shardq.run_attributes WHERE execution_id = %s"
                          " ORDER BY name",
        "tasks": "SELECT execution_id, claims, cancel_requested, priority, tenant"
                 " FROM shardq.tasks WHERE execution_id = %s",
        "outbox": "SELECT source_execution_id, source_position, target_execution_id, payload,"
                  " state FROM shardq.outbox WHERE source_execution_id = %s ORDER BY id",
    }
    out: dict[uuid.UUID, dict[str, list[tuple[Any, ...]]]] = {}
    with psycopg.connect(url) as conn:
        for run in ids:
            found = {t: [tuple(r) for r in conn.execute(q, (run,))] for t, q in queries.items()}
            if any(found.values()):
                out[run] = found
    return out


def ownership(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT map_version, writable::text, owned::text, unclean, fence_move, fence_target"
            " FROM shardq.ownership").fetchone()
    assert row is not None
    return dict(zip(("map_version", "writable", "owned", "unclean", "fence_move",
                     "fence_target"), row, strict=True))


def check_ownership(dep: Deployment) -> list[dict[str, Any]]:
    """Every bucket owned by exactly one shard and writable on at most one.

    Between a batch's switch (S1, on the target) and its release (R, on the source)
    the source still has the bits in `owned`, frozen: the owner is then the target,
    where the bucket is writable, and the source names it as its fence's target.
    """
    owns = [ownership(u) for u in dep.urls]
    names = [s.name for s in dep.seeds.shards]
    for bucket in range(BUCKETS):
        owners = [i for i, o in enumerate(owns) if o["owned"][bucket] == "1"]
        writable = [i for i, o in enumerate(owns) if o["writable"][bucket] == "1"]
        assert len(writable) <= 1, f"bucket {bucket} writable on {writable}"
        assert len(owners) in (1, 2), f"bucket {bucket} has {len(owners)} owners"
        if len(owners) == 2:
            assert len(writable) == 1, f"bucket {bucket}: two owners, {writable} writable"
            (frozen,) = set(owners) - set(writable)
            assert owns[frozen]["fence_target"] == names[writable[0]], bucket
    return owns


def owner_of(owns: list[dict[str, Any]], run: uuid.UUID) -> int:
    bucket = bucket_of(run)
    writable = [i for i, o in enumerate(owns) if o["writable"][bucket] == "1"]
    if writable:
        return writable[0]
    return next(i for i, o in enumerate(owns) if o["owned"][bucket] == "1")


def check_rows_once(dep: Deployment, before: dict[uuid.UUID, Any], *,
                    stale_ok: bool = False) -> None:
    """Every run's rows on its owner, as they were; on no other shard unless `stale_ok`
    (a switched batch not yet cleaned up: the owner bits decide, the rows wait)."""
    owns = check_ownership(dep)
    where = [dump(u, list(before)) for u in dep.urls]
    for run, rows in before.items():
        owner = owner_of(owns, run)
        assert where[owner].get(run) == rows, f"run {run} differs on shard-{owner}"
        for i, found in enumerate(where):
            if i != owner and not stale_ok:
                assert run not in found, f"run {run} also on shard-{i}"


def maps(url: str) -> list[tuple[int, Any]]:
    with psycopg.connect(url) as conn:
        return [(v, layout) for v, layout in conn.execute(
            "SELECT version, layout FROM shardq.shard_maps ORDER BY version")]


def fence_state(url: str, run: uuid.UUID) -> str | None:
    """What shardq.fence says of a write to `run` here: None (writable), or its SQLSTATE."""
    try:
        with psycopg.connect(url) as conn:
            conn.execute("SELECT shardq.fence(ARRAY[%s::uuid])", (run,))
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def options(**given: Any) -> MoveOptions:
    return MoveOptions(**{"max_batch_runs": 10, "grace_s": 0.0, "rest": 0.0, **given})


# -- the tests --------------------------------------------------------------------------------


def test_every_row_of_a_moved_run_moves_once_and_keeps_its_ids(deployment: Deployment) -> None:
    inside, outside = populate(deployment)
    before = {**dump(deployment.urls[0], inside), **dump(deployment.urls[0], outside)}
    with psycopg.connect(deployment.urls[0]) as conn:
        maxima = conn.execute(
            "SELECT (SELECT max(seq) FROM shardq.history WHERE execution_id = ANY(%(ids)s)),"
            " (SELECT max(id) FROM shardq.signals WHERE execution_id = ANY(%(ids)s))",
            {"ids": inside}).fetchone()
    assert maxima is not None

    result = mover.move(deployment.seeds, *MOVED, "shard-1", options())

    doc = result.as_dict()
    assert doc["phase"] == "done" and doc["runs_moved"] == len(inside)
    assert len(doc["batches"]) >= 3  # 24 runs, at most 10 per batch
    assert all(b["phase"] == "cleaned" for b in doc["batches"])
    check_rows_once(deployment, before)
    owns = check_ownership(deployment)
    assert {owner_of(owns, r) for r in inside} == {1}
    assert {owner_of(owns, r) for r in outside} == {0}
    # Ownership: shard-1 has 1024-1535 and its own 2048-4095; nothing frozen, both clean.
    assert owns[0]["owned"] == "1" * 1024 + "0" * 512 + "1" * 512 + "0" * 2048
    assert owns[1]["owned"] == "0" * 1024 + "1" * 512 + "0" * 512 + "1" * 2048
    for own in owns:
        assert own["writable"] == own["owned"] and not own["unclean"]
        assert own["fence_move"] is None and own["fence_target"] is None
    # One version per batch, on both shards (home is shard-0), the last one naming the move.
    final = 1 + len(doc["batches"])
    assert [o["map_version"] for o in owns] == [final, final] == [doc["map_version"]] * 2
    assert maps(deployment.urls[0]) == maps(deployment.urls[1])
    assert maps(deployment.urls[0])[-1][1]["ranges"] == [
        [0, 1023, "shard-0"], [1024, 1535, "shard-1"], [1536, 2047, "shard-0"],
        [2048, 4095, "shard-1"]]
    # Leases released on the copy; timers keep their wake time (compared in `before`).
    with psycopg.connect(deployment.urls[1]) as conn:
        leased = conn.execute(
            "SELECT count(*) FILTER (WHERE lease_token IS NOT NULL OR lease_owner IS NOT NULL),"
            " count(*) FILTER (WHERE claims = 2 AND run_at <= now()),"
            " count(*) FROM shardq.tasks WHERE execution_id = ANY(%s)", (inside,)).fetchone()
        # The leased third (claims 2) is due at once; the others keep their run_at.
        assert leased == (0, len(inside[::3]), len(inside))
        # The target's sequences are past every copied id: a later event of a moved run
        # sorts after its copied ones.
        seq = conn.execute("SELECT nextval(pg_get_serial_sequence('shardq.history', 'seq')),"
                           " nextval(pg_get_serial_sequence('shardq.signals', 'id'))").fetchone()
    assert seq is not None and seq[0] > maxima[0] and seq[1] > maxima[1]
    # The fence follows the bits: the source refuses the moved runs as not theirs.
    assert fence_state(deployment.urls[0], inside[0]) == "SQ002"
    assert fence_state(deployment.urls[1], inside[0]) is None
    assert fence_state(deployment.urls[0], outside[0]) is None


def test_the_target_plans_by_the_rows_a_move_copied_into_it(deployment: Deployment) -> None:
    """A move copies faster than autovacuum notices: the target's statistics would
    describe tables a fraction of their size, and its claims plan as if they were (at
    100,000 runs, seconds per claim). Tables the move grew by at least as many rows
    as their statistics describe are analyzed after the batch."""
    inside, _ = populate(deployment, moved=400, kept=1)

    mover.move(deployment.seeds, *MOVED, "shard-1", options(max_batch_runs=1000))

    with psycopg.connect(deployment.urls[1]) as conn:
        described: dict[str, float] = dict(conn.execute(
            "SELECT relname, reltuples FROM pg_class WHERE relnamespace = 'shardq'::regnamespace"
            " AND relname IN ('history', 'executions')").fetchall())
    # history: three rows of each moved run, 1,200 >= 1,000 rows; executions: 400, left
    # to autovacuum (the 5 runs shard-1 had of its own are not counted by either).
    assert described["history"] >= 3 * len(inside)
    assert described["executions"] < len(inside)


def test_a_keyed_resignal_after_the_move_collapses_on_the_target(deployment: Deployment) -> None:
    inside, _ = populate(deployment, moved=4, kept=1)
    with psycopg.connect(deployment.urls[0]) as conn:
        first = conn.execute("SELECT id FROM shardq.signals WHERE idempotency_key = 'in-key2-1'"
                             ).fetchone()
    mover.move(deployment.seeds, *MOVED, "shard-1", options())
    with psycopg.connect(deployment.urls[1]) as conn:
        again = conn.execute(
            "SELECT signal_id, earlier_id, reason_code FROM shardq.deliver_signals("
            "'default', ARRAY[%s::uuid], ARRAY['paid'], ARRAY['3'::jsonb], ARRAY['in-key2-1'],"
            " 100, 1000, NULL)", (inside[1],)).fetchone()
        keyed = conn.execute("SELECT count(*) FROM shardq.signals WHERE execution_id = %s"
                             " AND idempotency_key = 'in-key2-1'", (inside[1],)).fetchone()
    assert first is not None and again is not None
    assert again[0] is None and again[1] == first[0]  # collapsed onto the moved signal
    assert keyed == (1,)


def test_a_key_moves_with_its_limit_its_slots_and_its_queue(deployment: Deployment) -> None:
    """A concurrency key lives in its bucket: a move carries its limit row (an operator's
    limit too), the task rows holding its slots and the runs waiting for one, and the
    target admits and promotes by them as the source did."""
    key = next(k for k in (f"acct:{i}" for i in range(10_000))
               if MOVED[0] <= bucket_for_key(k) <= MOVED[1])
    with Client.connect(deployment.seeds, KEYED) as client:
        runs = [r.execution_id for r in client.start_many(
            "keyed", [(f"k{i}", None) for i in range(5)], concurrency=(key, 2))]
        client.set_concurrency_limit(key, 3)

        mover.move(deployment.seeds, *MOVED, "shard-1", options())

        with psycopg.connect(deployment.urls[1]) as conn:
            assert conn.execute(
                "SELECT declared, override FROM shardq.concurrency_keys WHERE key = %s",
                (key,)).fetchone() == (2, 3)
            assert conn.execute("SELECT count(*) FROM shardq.tasks WHERE concurrency_key = %s",
                                (key,)).fetchone() == (3,)
            assert conn.execute("SELECT count(*) FROM shardq.key_queue WHERE concurrency_key"
                                " = %s", (key,)).fetchone() == (2,)
        for url in deployment.urls[:1]:
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT (SELECT count(*) FROM shardq.concurrency_keys),"
                                    " (SELECT count(*) FROM shardq.key_queue)").fetchone() == (0, 0)
        # On the target: a cancel of a run holding a slot promotes one waiting there.
        client.cancel(runs[0])
        assert client.concurrency_limit(key) == ConcurrencyLimit(key, 2, 3, 3, 1)
        assert [client.get(r).waiting_for_slot for r in runs].count(True) == 1


def test_the_freeze_waits_for_a_writer_that_held_an_xid_and_copies_its_write(
    deployment: Deployment,
) -> None:
    inside, _ = populate(deployment, moved=3, kept=1)
    run = inside[0]
    writer = psycopg.connect(deployment.urls[0])
    # A writer that checked the fence before the freeze: it holds a row lock (an xid)
    # and writes after the freeze commits.
    writer.execute("SELECT 1 FROM shardq.tasks WHERE execution_id = %s FOR UPDATE", (run,))
    done: list[MoveResult] = []
    thread = threading.Thread(target=lambda: done.append(mover.move(
        deployment.seeds, *MOVED, "shard-1", options(fence_wait_s=20.0))))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while fence_state(deployment.urls[0], run) != "SQ001":
            assert time.monotonic() < deadline, "the batch was never frozen"
            time.sleep(0.01)
        time.sleep(0.2)
        assert ownership(deployment.urls[1])["owned"][bucket_of(run)] == "0", \
            "switched while a writer that held an xid was still open"
        writer.execute("INSERT INTO shardq.signals (execution_id, tenant, name, payload)"
                       " VALUES (%s, 'default', 'late', '1')", (run,))
        writer.commit()
    finally:
        thread.join(30)
        writer.close()
    assert done and done[0].phase == "done"
    with psycopg.connect(deployment.urls[1]) as conn:
        assert conn.execute("SELECT count(*) FROM shardq.signals WHERE execution_id = %s"
                            " AND name = 'late'", (run,)).fetchone() == (1,)


def test_copy_column_lists_name_every_column_of_each_table(deployment: Deployment) -> None:
    with psycopg.connect(deployment.urls[0]) as conn:
        for table in COPIES:
            columns = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema ="
                " 'shardq' AND table_name = %s AND is_generated = 'NEVER'"
                " ORDER BY ordinal_position", (table,))]
            _out, into = COPIES[table]
            named = into[into.index("(") + 1:into.index(")")].replace("\n", " ")
            listed = [c.strip() for c in named.split(",")]
            expected = [c for c in columns if not (table == "outbox" and c == "id")]
            assert listed == expected, table


def test_a_second_mover_is_refused_naming_the_running_move(deployment: Deployment) -> None:
    populate(deployment, moved=2, kept=1)
    dep = move_deployment.Deployment.load(deployment.seeds)
    with move_deployment.mover_lock(dep) as home:
        number = mover.Mover(dep, home, options()).start(*MOVED, "shard-1")
        with pytest.raises(MoveRunning, match=rf"move {number} \(buckets 1024-1535 "
                                                    r"from shard-0 to shard-1.*by pid \d+"):
            mover.move(deployment.seeds, 0, 10, "shard-1", options())
    # The lock is free, the move unfinished: another range is refused until resumed.
    with pytest.raises(MoveRunning, match=r"unfinished.*--resume"):
        mover.move(deployment.seeds, 0, 10, "shard-1", options())
    assert mover.move(deployment.seeds, None, None, None, options(), resume=True).phase == "done"


def _cli(dep: Deployment, *args: str) -> tuple[int, str]:
    group = click.Group("shards")
    move_cli.register(group)
    runner = CliRunner()
    settings = Settings(",".join(dep.urls), None, "--json" in args, 0)
    done = runner.invoke(group, list(args), obj=settings)
    return done.exit_code, done.output


@pytest.mark.parametrize(("args", "code", "message"), [
    (["move", "10-5", "--to", "shard-1"], 2, "empty"),
    (["move", "--to", "shard-1", "--", "-1-3"], 2, "not FIRST-LAST"),
    (["move", "0-4096", "--to", "shard-1"], 2, "outside"),
    (["move", "1-2-3", "--to", "shard-1"], 2, "not FIRST-LAST"),
    (["move", "a-b", "--to", "shard-1"], 2, "not FIRST-LAST"),
    (["move", " 1 - 2 ", "--to", "shard-1"], 2, "not FIRST-LAST"),
    # int() reads any script's digits; a range is ASCII digits only.
    (["move", "\uff11-\uff12", "--to", "shard-1"], 2, "not FIRST-LAST"),
    (["move", "1-\uff12", "--to", "shard-1"], 2, "not FIRST-LAST"),
    (["move", "\u0663", "--to", "shard-1"], 2, "not FIRST-LAST"),
    (["move", "\U0001d7d9", "--to", "shard-1"], 2, "not FIRST-LAST"),
    (["move", "2000-2100", "--to", "shard-1"], 2, "2000-2047 on shard-0; 2048-2100 on shard-1"),
    (["move", "5", "--to", "nowhere"], 2, "unknown shard 'nowhere'"),
    (["move", "5", "--to", "shard-0"], 2, "shard-0 already owns buckets 5-5"),
    (["move", "5", "--to", "shard-1", "--batch-runs", "0"], 2, "not within"),
    (["move", "5", "--to", "shard-1", "--batch-runs", "-5"], 2, "not within"),
    (["move", "5", "--to", "shard-1", "--batch-runs", "1e9"], 2, "not a valid integer"),
    (["move", "5", "--to", "shard-1", "--batch-rows", "0"], 2, "not within"),
    (["move", "5"], 2, "--to NAME"),
    (["move", "--resume"], 2, "no unfinished move"),
    (["move", "--abort", "--json"], 2, "no unfinished move"),
    (["move", "--resume", "--abort"], 2, "exclude"),
    (["move", "5", "--to", "shard-1", "--grace", "nan"], 2, "finite"),
    (["move", "5", "--to", "shard-1", "--rest", "nan"], 2, "finite"),
    (["move", "5", "--to", "shard-1", "--rest", "-1"], 2, ">= 0 and <= 100"),
    (["move", "5", "--to", "shard-1", "--rest", "1e9"], 2, ">= 0 and <= 100"),
    (["rebalance", "--rest", "inf"], 2, "finite"),
    (["move", "5", "--to", "shard-1", "--max-pause", "nan"], 2, "finite"),
    (["move", "5", "--to", "shard-1", "--max-pause", "-1"], 2, ">= 0 and <= 3600"),
    (["move", "5", "--to", "shard-1", "--max-pause", "1e9"], 2, ">= 0 and <= 3600"),
    (["move", "5", "--to", "shard-1", "--max-pause", "1s"], 2, "--max-pause"),
    (["rebalance", "--max-pause", "inf"], 2, "finite"),
])
def test_hostile_move_input_is_one_line_and_stores_nothing(
    deployment: Deployment, args: list[str], code: int, message: str,
) -> None:
    status, out = _cli(deployment, *args)
    assert status == code, out
    assert message in out
    assert "Traceback" not in out
    with psycopg.connect(deployment.urls[0]) as conn:
        assert conn.execute("SELECT count(*) FROM shardq.moves").fetchone() == (0,)
    check_ownership(deployment)
    assert ownership(deployment.urls[0])["map_version"] == 1


def test_move_cli_json_and_one_bucket(deployment: Deployment) -> None:
    inside, _ = populate(deployment, moved=2, kept=1)
    bucket = bucket_of(inside[0])
    status, out = _cli(deployment, "move", str(bucket), "--to", "shard-1", "--grace", "0",
                       "--json")
    assert status == 0, out
    doc = json.loads(out[out.index("{"):])
    assert doc["buckets"] == [bucket, bucket] and doc["phase"] == "done"
    assert doc["runs_moved"] >= 1
    assert ownership(deployment.urls[1])["owned"][bucket] == "1"


def test_rebalance_evens_runs_and_dry_run_moves_nothing(deployment: Deployment) -> None:
    populate(deployment, moved=20, kept=20)
    status, out = _cli(deployment, "rebalance", "--dry-run", "--json")
    assert status == 0, out
    plan = json.loads(out[out.index("{"):])
    assert plan["plan"] and plan["runs"] == {"shard-0": 40, "shard-1": 5}
    assert ownership(deployment.urls[0])["map_version"] == 1
    status, out = _cli(deployment, "rebalance", "--grace", "0", "--json")
    assert status == 0, out
    with psycopg.connect(deployment.urls[0]) as a, psycopg.connect(deployment.urls[1]) as b:
        counts = [c.execute("SELECT count(*) FROM shardq.executions").fetchone()[0]  # type: ignore[index]
                  for c in (a, b)]
    assert abs(counts[0] - counts[1]) <= 0.2 * sum(counts) / 2 + 1, counts


def test_planning_and_ranges() -> None:
    assert parse_range("5") == (5, 5)
    assert parse_range("0-4095") == (0, 4095)
    for spelled in ("5\n", "0-4095\n", "\uff11-\uff12", " 5", "5-"):
        with pytest.raises(ConfigError, match="is not FIRST-LAST or N"):
            parse_range(spelled)
    batches = plan_batches({1: (5, 50), 2: (5, 50), 3: (20, 10), 7: (1, 1)}, 0, 9, 10, 1000)
    # Empty buckets stay with the batch before them; only a bucket with runs starts one.
    assert [(b.first, b.last, b.runs) for b in batches] == [(0, 2, 10), (3, 6, 20), (7, 9, 1)]
    assert [(b.first, b.last, b.runs) for b in plan_batches({5: (2, 20)}, 0, 9, 1, 5)] == [
        (0, 9, 2)]  # one bucket over both bounds is one batch, empties around it included
    layout = {"buckets": 4096, "home": "a", "shards": [{"name": "a", "url": ""},
              {"name": "b", "url": ""}], "ranges": [[0, 2047, "a"], [2048, 4095, "b"]]}
    assert reassign(layout, 2000, 2047, "b")["ranges"] == [[0, 1999, "a"], [2000, 4095, "b"]]
    plan = plan_rebalance(layout, {b: 1 for b in range(0, 3000)})
    assert [(m.source, m.target) for m in plan] == [("a", "b")]
    assert plan[0].last == 2047 and plan[0].runs == 548  # borders b: taken from a's top
