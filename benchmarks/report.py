"""Headline numbers, targets, and the printed table."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

Result = dict[str, Any]

TARGETS = (
    # (key, comparison, threshold, description)
    ("shardq_over_floor", ">=", 0.5, "backlog drain / raw SKIP LOCKED floor at the same k"),
    ("cycles_per_s", ">=", 3600.0, "durable start-park-signal-resume-complete cycles/s"),
    ("steps3_workflows_per_s", ">=", 1000.0, "3-step workflows/s, worst backlog depth"),
    ("wake_p99_ms", "<=", 5.0, "signal -> resumed step, p99"),
    ("wake_after_commit_p99_ms", "<=", 5.0,
     "signal's commit returned -> resumed step, p99 (wake_p99 without the disk's flush)"),
    ("wake_p99_pgbouncer_over_direct", "<=", 1.2,
     "wake p99 with the worker and client through PgBouncer (transaction mode) / direct"),
    ("parked_ratio", ">=", 0.9, "drain beside parked runs / drain beside none"),
    ("relay_throughput_ratio", ">=", 0.5, "cross-shard signals/s / same-shard signals/s"),
    ("relay_p99_ratio", "<=", 3.0, "cross-shard p99 / same-shard p99, signal -> resumed"),
    ("fanout_one_call_speedup", ">=", 10.0,
     "a run signalling 1,000 of its shard: a call each / one signal_external_many call"),
    ("wal_over_floor", "<=", 2.0,
     "WAL bytes per one-step job: backlog drain / raw floor at the same k"),
    ("pg_cpu_over_floor", "<=", 1.3,
     "PostgreSQL CPU per one-step job (backlog drain) / the raw floor's whole-job CPU"),
    ("reshard_drain_ratio", ">=", 0.8, "drain on other buckets while a range moves / before it"),
    ("reshard_max_pause_ms", "<=", 2000.0,
     "longest Client.signal call to a moving run, during the move"),
    ("reshard_client_errors", "<=", 0.0, "errors clients of moving runs saw"),
    ("priority_p99_ratio", "<=", 2.0,
     "time to claim of priority work, p99: during a flood of priority-0 work / idle"),
    ("limited_over_unlimited", ">=", 0.9,
     "drain of one-step runs, limit 1 per key / the same runs with no limit"),
    ("limit_violations", "<=", 0.0,
     "samples (every 10 ms) where a key held more live leases than its limit"),
    ("fairness_jain", ">=", 0.95,
     "Jain's index of 10 tenants' runs while one floods at 100x the others, weights equal"),
    ("rate_limit_error", "<=", 0.05,
     "|achieved / configured - 1| of a rate limiter shared by 4 workers over 2 shards"),
    ("fanin_over_drain", "<=", 1.5,
     "a parent starting 10,000 one-step children and waiting for all / draining as many runs"),
    ("cancel_tree_left", "<=", 0.0,
     "runs of a cancelled 3-level tree of 1,000 runs over 2 shards still live after 300 s"),
    ("schedules_due_lag_p99_s", "<=", 5.0,
     "schedules due at one second (60,000): p99 of run start - tick, a worker SIGKILLed"),
    ("schedule_duplicates", "<=", 0.0, "ticks that started more than one run"),
    ("schedule_misses", "<=", 0.0, "ticks that started no run"),
    ("otel_overhead", ">=", 0.9,
     "drain with tracing on (in-memory exporter) / the same drain with tracing off"),
    ("replay_runs_per_s", ">=", 5000.0,
     "shardq replay over 100,000 recorded three-step histories: runs/s, its start-up included"),
    ("list_page_p99_ms", "<=", 50.0,
     "Client.list_runs page of 100, 8 shards of 1,000,000 runs: the worst filter kind's p99"),
    ("list_page_over_single_shard", "<=", 2.0,
     "median page of 100, 8 shards / 1 shard, 1,000,000 runs each: the median kind's"),
    ("count_by_state_ms", "<=", 100.0,
     "Client.count_runs (every workflow, by state), 8 shards of 1,000,000 runs: p99 ms"),
    ("visibility_seq_scans", "<=", 0.0,
     "sequential scans of shardq's run tables while the visibility pages were listed"),
    ("connections_per_worker_64_shards", "<=", 16.0,
     "a worker's sessions, peak, draining 64 shards (schemas, 32 on each of 2 servers)"),
)


def headline(scenarios: dict[str, Result]) -> Result:
    """The flat keys scripts read: drain_jobs_per_s, floor_jobs_per_s, wake_p99_ms, ..."""
    out: Result = {}
    if "floor" in scenarios:
        out["floor_jobs_per_s"] = scenarios["floor"]["jobs_per_s"]
        out["floor_batch"] = scenarios["floor"]["batch_size"]
        out["floor_by_batch"] = {str(r["k"]): r["jobs_per_s"] for r in scenarios["floor"]["runs"]}
    if "durable" in scenarios:
        d = scenarios["durable"]
        out["durable_floor_jobs_per_s"] = d["jobs_per_s"]
        if out.get("floor_jobs_per_s") and d["k"] == out["floor_batch"]:
            out["durable_over_floor"] = round(d["jobs_per_s"] / out["floor_jobs_per_s"], 3)
    if "claim" in scenarios:
        c = scenarios["claim"]
        out["drain_jobs_per_s"] = c["drain_jobs_per_s"]
        out["drain_workers_first_jobs_per_s"] = c["workers_first"]["jobs_per_s"]
        out["drain_enqueue_first_jobs_per_s"] = c["enqueue_first"]["jobs_per_s"]
        out["enqueue_bulk_per_s"] = c["enqueue_bulk_per_s"]
        out["enqueue_single_per_s"] = c["enqueue_single_per_s"]
        if out.get("floor_jobs_per_s"):
            out["shardq_over_floor"] = round(c["drain_jobs_per_s"] / out["floor_jobs_per_s"], 3)
        if "durable" in scenarios:
            out["shardq_over_durable_floor"] = round(
                c["drain_jobs_per_s"] / scenarios["durable"]["jobs_per_s"], 3)
    out.update(_ceilings(scenarios, out.get("floor_batch")))
    out.update(_db_cost(scenarios, out.get("floor_batch"), out.get("floor_cpu_us_per_job")))
    if "wake" in scenarios:
        w = scenarios["wake"]
        out.update(wake_p50_ms=w["p50_ms"], wake_p95_ms=w["p95_ms"], wake_p99_ms=w["p99_ms"])
        if "after_commit_ms" in w:
            out["wake_after_commit_p99_ms"] = w["after_commit_ms"]["p99"]
        if "pgbouncer_over_direct_p99" in w:
            out["wake_p99_pgbouncer_ms"] = w["pgbouncer"]["p99_ms"]
            out["wake_p99_pgbouncer_over_direct"] = w["pgbouncer_over_direct_p99"]
    if "cycle" in scenarios:
        out["cycles_per_s"] = scenarios["cycle"]["cycles_per_s"]
    if "steps3" in scenarios:
        by = {str(r["backlog"]): r["workflows_per_s"] for r in scenarios["steps3"]["backlogs"]}
        out["steps3_workflows_per_s"] = min(by.values())
        out["steps3_by_backlog"] = by
    if "parked" in scenarios:
        out["parked_ratio"] = scenarios["parked"]["ratio"]
        out["parked_runs"] = scenarios["parked"]["parked"]
    if "relay" in scenarios:
        r = scenarios["relay"]
        out.update(
            relay_same_shard_signals_per_s=r["same_shard"]["signals_per_s"],
            relay_cross_shard_signals_per_s=r["cross_shard"]["signals_per_s"],
            relay_throughput_ratio=r["cross_over_same_throughput"],
            relay_same_shard_p99_ms=r["same_shard_latency_ms"].get("p99"),
            relay_cross_shard_p50_ms=r["cross_shard_latency_ms"].get("p50"),
            relay_cross_shard_p99_ms=r["cross_shard_latency_ms"].get("p99"),
            relay_p99_ratio=r["cross_over_same_p99"],
        )
        if "fanout_one_call_speedup" in r:  # results saved before the fan-out was measured
            out["fanout_one_call_speedup"] = r["fanout_one_call_speedup"]
    if "reshard" in scenarios:
        r = scenarios["reshard"]
        out.update(reshard_runs_moved_per_s=r["runs_moved_per_s"],
                   reshard_max_pause_ms=r["client_max_pause_ms"],
                   reshard_client_errors=r["client_errors"],
                   reshard_drain_ratio=r["drain_ratio"])
    if "limits" in scenarios:
        lim = scenarios["limits"]
        out.update(priority_p99_ratio=lim["priority_p99_ratio"],
                   priority_idle_p99_ms=lim["idle_time_to_claim_ms"].get("p99"),
                   priority_flood_p99_ms=lim["flood_time_to_claim_ms"].get("p99"),
                   priority0_flood_p99_ms=lim["flood_p0_time_to_claim_ms"].get("p99"))
        if "limited_over_unlimited" in lim:  # results saved before limits were measured
            out.update({k: lim[k] for k in (
                "limited_over_unlimited", "limited_runs_per_s", "unlimited_runs_per_s",
                "limit_violations", "limit_most_live",
                "limit_samples")})
        if "fairness_jain" in lim:  # results saved before fairness and rates were measured
            out.update({k: lim[k] for k in (
                "fairness_jain", "fairness_window_runs", "rate_limit_error",
                "rate_limit_achieved_per_s", "rate_limit_configured_per_s",
                "rate_limit_worst_1s_starts", "rate_limit_burst_error")})
    if "composition" in scenarios:
        c = scenarios["composition"]
        out.update({k: c[k] for k in (
            "fanin_10k_s", "fanin_over_drain", "fanin_children", "cancel_tree_s",
            "cancel_tree_left", "schedules_due_lag_p99_s", "schedule_duplicates",
            "schedule_misses")})
    if "upgrades" in scenarios:
        out.update({k: scenarios["upgrades"][k] for k in (
            "replay_runs_per_s", "replay_runs", "replay_check_runs_per_s", "otel_overhead")})
    if "visibility" in scenarios:
        v = scenarios["visibility"]
        out.update({k: val for k, val in v.items() if k.startswith("list_page_") or k in (
            "visibility_runs_per_shard", "visibility_load_s", "visibility_seq_scans",
            "count_by_state_ms", "count_by_workflow_ms")})
    out.update({k: v for k, v in scenarios.get("connections", {}).items()
                if k.startswith("connections_")})
    if "http" in scenarios:
        h = scenarios["http"]
        out.update(http_signals_per_s=h["http_signals_per_s"],
                   client_signals_per_s=h["client_signals_per_s"],
                   http_over_client=h["http_over_client"],
                   http_2_processes_over_client=h.get("http_2_processes_over_client"))
    return out


def _ceilings(scenarios: dict[str, Result], k: int | None) -> Result:
    """The ratios shardq would reach if its client (worker) cost no CPU at all.

    On a machine whose cores run both sides, a drain's rate is the busy cores
    over the CPU a job costs them all. The raw floor's job costs its loop and
    PostgreSQL; shardq's costs at least PostgreSQL's share. So floor CPU per job
    over shardq's PostgreSQL CPU per job bounds the ratio to the floor that any
    worker, however lean, can reach: a target above it asks for less work in
    the database, not in Python.
    """
    floor = next((r for r in scenarios.get("floor", {}).get("runs", []) if r["k"] == k), None)
    if floor is None or floor["cpu"].get("postgres_us_per_job") is None:
        return {}
    floor_us = floor["cpu"]["workers_us_per_job"] + floor["cpu"]["postgres_us_per_job"]
    out: Result = {"floor_cpu_us_per_job": round(floor_us, 1)}
    sources = (("durable_pg_ceiling", scenarios.get("durable", {}).get("cpu")),
               ("drain_pg_ceiling", scenarios.get("claim", {}).get("backlog", {}).get("cpu")))
    for key, cpu in sources:
        if cpu and cpu.get("postgres_us_per_job"):
            out[key] = round(floor_us / cpu["postgres_us_per_job"], 3)
    return out


def _floor_run(scenarios: dict[str, Result], k: int | None) -> Result | None:
    return next((r for r in scenarios.get("floor", {}).get("runs", []) if r["k"] == k), None)


def _cost_drains(scenarios: dict[str, Result], k: int | None) -> list[tuple[str, str, Result]]:
    """(key prefix, name, drain result) of the three drains whose cost per job is compared:
    the raw floor at shardq's batch size, the durable floor, shardq's backlog drain."""
    drains: list[tuple[str, str, Result]] = []
    floor = _floor_run(scenarios, k)
    if floor is not None:
        drains.append(("floor", f"raw floor k={k}", floor))
    if "durable" in scenarios:
        drains.append(("durable", f"durable floor k={scenarios['durable']['k']}",
                       scenarios["durable"]))
    if "claim" in scenarios:
        drains.append(("drain", "backlog drain", scenarios["claim"]["backlog"]))
    return drains


def _db_cost(scenarios: dict[str, Result], k: int | None, floor_us: float | None) -> Result:
    """WAL bytes and PostgreSQL CPU per job of each drain, and over the raw floor's.

    WAL: the floor's own WAL at the same k. CPU: the floor's whole job (its loop
    and PostgreSQL), the cost a job of the plainest queue has in all.
    """
    out: Result = {}
    for prefix, _, d in _cost_drains(scenarios, k):
        if d.get("wal", {}).get("bytes_per_job") is not None:
            out[f"{prefix}_wal_bytes_per_job"] = d["wal"]["bytes_per_job"]
        if prefix != "floor" and d["cpu"].get("postgres_us_per_job") is not None:
            out[f"{prefix}_pg_us_per_job"] = d["cpu"]["postgres_us_per_job"]
    if "durable" in scenarios and scenarios["durable"]["k"] != k:
        out.pop("durable_wal_bytes_per_job", None)
        out.pop("durable_pg_us_per_job", None)
    floor_wal = out.get("floor_wal_bytes_per_job")
    for prefix, key in (("drain", "wal_over_floor"), ("durable", "durable_wal_over_floor")):
        if floor_wal and out.get(f"{prefix}_wal_bytes_per_job") is not None:
            out[key] = round(out[f"{prefix}_wal_bytes_per_job"] / floor_wal, 3)
    for prefix, key in (("drain", "pg_cpu_over_floor"), ("durable", "durable_pg_cpu_over_floor")):
        if floor_us and out.get(f"{prefix}_pg_us_per_job") is not None:
            out[key] = round(out[f"{prefix}_pg_us_per_job"] / floor_us, 3)
    return out


def cost_rows(sc: dict[str, Result], head: Result) -> list[tuple[str, str, str, str]]:
    """(drain, what, per job, details): what one job of each compared drain cost the database."""
    rows: list[tuple[str, str, str, str]] = []
    split_seen = False
    for prefix, name, d in _cost_drains(sc, head.get("floor_batch")):
        wal = d.get("wal")
        if wal is None:
            continue
        if "by_rmgr" in wal:
            kinds = ", ".join(f"{kind} {_n(e['bytes_per_job'])}"
                              for kind, e in list(wal["by_rmgr"].items())[:5])
            relations = ", ".join(f"{name} {_n(e['bytes_per_job'])}"
                                  for name, e in list(wal.get("by_relation", {}).items())[:6])
            detail = (f"{_n(wal['records_per_job'])} records/job, full-page images "
                      f"{_n(wal['fpi_bytes_per_job'])} B/job; by record type (B/job): {kinds}"
                      + (f"; by relation (B/job): {relations}" if relations else ""))
        else:
            detail = "the whole server's WAL" + (
                f" ({wal['by_rmgr_error']})" if "by_rmgr_error" in wal
                else "; by record type: pg_walinspect unavailable")
        rows.append((name, "WAL", f"{_n(wal['bytes_per_job'])} B/job", detail))
        pg_us = d["cpu"].get("postgres_us_per_job")
        if pg_us is not None:
            whole = (f"; whole job with its loop {_n(d['cpu']['workers_us_per_job'] + pg_us)} us"
                     if prefix == "floor" else
                     f"; {_n(head[prefix + '_pg_us_per_job'] / head['floor_cpu_us_per_job'])}x "
                     f"the raw floor's whole job ({_n(head['floor_cpu_us_per_job'])} us)"
                     if head.get("floor_cpu_us_per_job") and f"{prefix}_pg_us_per_job" in head
                     else "")
            rows.append((name, "PostgreSQL CPU", f"{_n(pg_us)} us/job",
                         "every postgres process on the machine" + whole))
        split = d.get("by_statement")
        if split is None:
            continue
        split_seen = True
        for st in split["statements"]:
            share = st.get("exec_share")
            cpu = (f"; ~{_n(round(share * pg_us, 1))} us of PostgreSQL CPU/job at that share"
                   if st["toplevel"] and share is not None and pg_us is not None else "")
            rows.append((name, st["statement"],
                         f"{_n(st['exec_us_per_job'])} us/job"
                         + (f" ({100 * share:.0f}%)" if st["toplevel"] and share is not None
                            else ""),
                         f"{st['calls']:,} calls, {st['rows']:,} rows; WAL "
                         f"{_n(st['wal_bytes_per_job'])} B/job ({st['wal_records']:,} records, "
                         f"{st['wal_fpi']:,} full-page images); shared blocks dirtied "
                         f"{st['shared_blks_dirtied']:,}, written {st['shared_blks_written']:,}"
                         + (cpu if st["toplevel"] else "; its time is in its caller's too")))
        if split["more_statements"]:
            rows.append((name, f"{split['more_statements']} more statements",
                         f"{_n(split['more_exec_us_per_job'])} us/job", ""))
        if split["toplevel_exec_us_per_job"] is not None:
            rows.append((name, "statements in all",
                         f"{_n(split['toplevel_exec_us_per_job'])} us/job",
                         "the time inside top-level statements, a wall time: it holds waits "
                         "for locks, I/O and a free core, so it is no CPU figure; PostgreSQL "
                         "CPU per job" + (f" was {_n(pg_us)} us" if pg_us is not None else "")
                         + ". In no statement's time: the commits (their WAL flush), "
                         "parsing, the protocol"))
        if split["toplevel_wal_bytes_per_job"] is not None:
            outside = round(wal["bytes_per_job"] - split["toplevel_wal_bytes_per_job"], 1)
            rows.append((name, "WAL in no statement", f"{_n(outside)} B/job",
                         "the commit records, and other databases' WAL on the server"))
    if rows and not split_seen:
        rows.append(("-", "per statement", "not measured",
                     "the server did not preload pg_stat_statements (shared_preload_libraries)"))
    return rows


def targets(head: Result) -> list[Result]:
    rows = []
    for key, op, threshold, what in TARGETS:
        value = head.get(key)
        met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        rows.append({"metric": key, "target": f"{op} {threshold:g}", "value": value, "met": met,
                     "what": what})
    return rows


def _n(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def _cpu(cpu: Result) -> str:
    parts = [f"busy {cpu.get('machine_busy_pct')}%"]
    if cpu.get("workers_us_per_job") is not None:
        parts.append(f"workers {cpu['workers_us_per_job']:g} us/job")
        parts.append(f"pg {cpu['postgres_us_per_job']:g} us/job")
    return ", ".join(parts)


def table(doc: Result) -> str:
    env, cfg, sc = doc["environment"], doc["config"], doc["scenarios"]
    pg = env["postgres"]
    commit = env.get("commit_latency", {})
    lines = [
        f"shardq benchmarks{' (quick)' if doc['quick'] else ''}  {doc['started_at']}  "
        f"commit {env['machine'].get('commit')}, engine {env['machine']['engine_fingerprint']}"
        + (f" (uncommitted: {', '.join(env['machine']['engine_files_modified'])})"
           if env["machine"]["engine_files_modified"] else ""),
        f"PostgreSQL {pg['server_version']}: fsync={pg['fsync']} "
        f"synchronous_commit={pg['synchronous_commit']} full_page_writes={pg['full_page_writes']}"
        f" shared_buffers={pg['shared_buffers']} autovacuum={pg.get('autovacuum', '?')};"
        f" one durable commit p50 "
        f"{commit.get('p50_ms')} ms, p99 {commit.get('p99_ms')} ms",
        f"machine: {env['machine']['cores']} cores, Python {env['machine']['python']}; "
        f"load {env['machine']['load_average_1m_at_start']} at start; "
        f"shards: {cfg['shards']} ({env['shards_source']})",
        f"workers: {cfg['worker_processes']} processes x concurrency {cfg['concurrency']}, "
        f"batch size {cfg['batch_size']}, poll {cfg['poll_interval_s']:g} s",
        "",
    ]
    rows = scenario_rows(sc)
    widths = [max(len(r[i]) for r in rows) if rows else 0 for i in range(3)]
    for r in rows:
        lines.append(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}")
    cost = cost_rows(sc, doc["headline"])
    if cost:
        lines.append("\nwhat one job cost the database (the timed window of each drain):")
        widths = [max(len(r[i]) for r in cost) for i in range(3)]
        for r in cost:
            lines.append(f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  "
                         f"{r[3]}")
    lines += ratio_lines(doc["headline"])
    lines.append("\ntargets (2 cores, PG15, fsync on):")
    for t in doc["targets"]:
        mark = {True: "met", False: "MISSED", None: "not run"}[t["met"]]
        lines.append(f"  {t['metric']:<24} {t['target']:>8}  {_n(t['value']):>10}  {mark:<7}  "
                     f"{t['what']}")
    return "\n".join(lines)


def scenario_rows(sc: dict[str, Result]) -> list[tuple[str, str, str, str]]:
    """(scenario, what, figure, details) for every figure of every scenario that ran."""
    rows: list[tuple[str, str, str, str]] = []
    if "floor" in sc:
        for r in sc["floor"]["runs"]:
            rows.append(("floor", f"raw SKIP LOCKED k={r['k']}", _n(r["jobs_per_s"]) + " jobs/s",
                         f"{r['processes']} procs x {r['threads_per_process']} threads, "
                         f"{r['jobs']:,} jobs in {r['seconds']:.2f} s; {_cpu(r['cpu'])}"))
    if "durable" in sc:
        d = sc["durable"]
        rows.append(("durable", f"shardq's Store, no worker k={d['k']}",
                     _n(d["jobs_per_s"]) + " jobs/s",
                     f"{d['processes']} procs x {d['threads_per_process']} threads, "
                     f"{d['jobs']:,} noop queued first, drained in {d['seconds']:.2f} s; "
                     f"{_cpu(d['cpu'])}"))
    if "claim" in sc:
        c = sc["claim"]
        bl, wf, ef = c["backlog"], c["workers_first"], c["enqueue_first"]
        rows += [
            ("claim", "enqueue bulk (start_many)", _n(c["enqueue_bulk_per_s"]) + " runs/s",
             f"{c['enqueue_bulk_n']:,} in one call, no worker running"),
            ("claim", "enqueue one by one (start)", _n(c["enqueue_single_per_s"]) + " runs/s",
             f"{c['enqueue_single_n']:,} sequential calls, one thread"),
            ("claim", "drain of a backlog", _n(bl["jobs_per_s"]) + " jobs/s",
             f"{bl['jobs']:,} noop queued while the idle workers were frozen, timed from "
             f"their thaw; {_cpu(bl['cpu'])}"),
            ("claim", "drain, workers first", _n(wf["jobs_per_s"]) + " jobs/s",
             f"{wf['jobs']:,} noop; insert {wf['insert_s']:.2f} s incl.; {_cpu(wf['cpu'])}"),
            ("claim", "drain, enqueue first", _n(ef["jobs_per_s"]) + " jobs/s",
             f"from spawn; startup {ef['worker_startup_s']:.2f} s, "
             + (f"{_n(ef['jobs_per_s_after_startup'])}/s after it"
                if ef["jobs_per_s_after_startup"] is not None
                else "all drained before the last worker was serving")),
        ]
    if "steps3" in sc:
        for r in sc["steps3"]["backlogs"]:
            rows.append(("steps3", f"closed loop, backlog {r['backlog']:,}",
                         _n(r["workflows_per_s"]) + " wf/s",
                         f"{r['completed']:,} in {r['seconds']:.1f} s, mean depth "
                         f"{r['mean_depth']:,}; tail drain {_n(r['tail_per_s'])}/s; "
                         f"{_cpu(r['cpu'])}"))
    if "cycle" in sc:
        c = sc["cycle"]
        rows.append(("cycle", "durable cycles", _n(c["cycles_per_s"]) + " cycles/s",
                     f"{c['runs']:,} runs; start {c['start_s']:.2f} s, park {c['park_s']:.2f} s,"
                     f" signal {c['signal_s']:.2f} s ({_n(c['signals_per_s'])}/s, "
                     f"{c['signal_threads']} threads x {c.get('signal_batch', 1)} per call), "
                     f"tail {c['resume_tail_s']:.2f} s"))
    if "wake" in sc:
        w = sc["wake"]
        for key, label in (("step_ms", "signal -> resumed step"),
                           ("resumed_ms", "signal -> workflow resumed"),
                           ("completed_ms", "signal -> completing commit began"),
                           ("signal_call_ms", "Client.signal call"),
                           ("after_commit_ms", "signal call returned -> resumed step")):
            if key not in w:
                continue
            s = w[key]
            rows.append(("wake", label, f"p50 {s['p50']:.2f} ms",
                         f"p95 {s['p95']:.2f}, p99 {s['p99']:.2f}, max {s['max']:.2f} ms; "
                         f"{w['samples']} samples, 1 worker, poll 60 s"))
        if "pgbouncer_over_direct_p99" in w:
            p = w["pgbouncer"]
            rows.append(("wake", "signal -> resumed step, through PgBouncer",
                         f"p50 {p['p50_ms']:.2f} ms",
                         f"p99 {p['p99_ms']:.2f} ms, {w['pgbouncer_over_direct_p99']:.2f}x "
                         "direct's; worker and client in transaction mode, LISTEN direct"))
    if "relay" in sc:
        r = sc["relay"]
        for side in ("same_shard", "cross_shard"):
            t, lat = r[side], r[f"{side}_latency_ms"]
            how = "in the sender's commit" if side == "same_shard" else "outbox + 1 relay"
            rows.append(("relay", f"{side.replace('_', '-')} signals ({how})",
                         _n(t["signals_per_s"]) + " signals/s",
                         f"{t['signals']:,} sender commit -> target done in {t['seconds']:.2f} s;"
                         f" latency p50 {lat['p50']:.2f}, p99 {lat['p99']:.2f} ms"))
        if "fanout_one_call_speedup" in r:
            one, single = r["fanout_one_call"], r["fanout_single_calls"]
            rows.append(("relay", f"fan-out to {one['signals']:,} runs of one shard",
                         f"{r['fanout_one_call_speedup']}x",
                         f"the sender: one signal_external_many call "
                         f"{one['sender_seconds']:.3f} s, a call each "
                         f"{single['sender_seconds']:.2f} s; to the last target done "
                         f"{one['seconds']:.2f} s and {single['seconds']:.2f} s"))
    if "parked" in sc:
        p = sc["parked"]
        rows += [
            ("parked", "drain beside 0 parked", _n(p["without_jobs_per_s"]) + " jobs/s",
             f"{p['jobs']:,} noop, median of {p['repeats']}"),
            ("parked", f"drain beside {p['parked']:,} parked",
             _n(p["with_jobs_per_s"]) + " jobs/s",
             f"ratio {p['ratio']:.3f}; parked rows inserted by SQL at "
             f"{_n(p['parked_insert_per_s'])}/s"),
        ]
    if "http" in sc:
        h = sc["http"]
        rows.append(("http", "keyed signals, Client.signal", _n(h["client_signals_per_s"])
                     + " signals/s", "the same signals in-process, no HTTP"))
        rows.append(("http", "keyed signals through shardq serve",
                     _n(h["http_signals_per_s"]) + " signals/s",
                     f"{h['http_over_client']:.2f}x Client.signal"
                     + (f"; two server processes {h['http_2_processes_over_client']:.2f}x"
                        if h.get("http_2_processes_over_client") is not None else "")))
    if "reshard" in sc:
        r = sc["reshard"]
        pause = r["batch_pause_ms"]
        rows += [
            ("reshard", f"move of {r['runs']:,} parked runs", _n(r["runs_moved_per_s"])
             + " runs/s", f"{r['runs_moved']:,} runs, {r['rows_moved']:,} rows in "
             f"{r['batches']} batches, {r['mover_s']:.2f} s with cleanup ({r['servers']}); "
             f"pause per batch p50 {pause.get('p50')}, max {pause.get('max')} ms"),
            ("reshard", "signalling a moving run", f"max {r['client_max_pause_ms']:.0f} ms",
             f"{r['client_calls_during_move']:,} calls during the move, p50 "
             f"{r['client_call_ms_during_move'].get('p50')} ms (before: "
             f"{r['client_call_ms_before'].get('p50')} ms); {r['client_errors']} errors"),
            ("reshard", "drain on other buckets", f"ratio {_n(r['drain_ratio'])}",
             f"{_n(r['drain_during']['jobs_per_s'])} jobs/s during the move, "
             f"{_n(r['drain_before']['jobs_per_s'])} before"),
        ]
    if "visibility" in sc:
        rows += _visibility_rows(sc["visibility"])
    return rows


def _visibility_rows(v: Result) -> list[tuple[str, str, str, str]]:
    """A row per filter kind of the visibility pages, then the ratio and the scans."""
    shards, runs = v["visibility_shards"], v["visibility_runs_per_shard"]
    rows = []
    for kind, page in v["pages"].items():
        one = v["single_shard"][kind]["ms"]
        rows.append(("visibility", f"list_runs page, {kind}", f"p99 {page['ms']['p99']:.1f} ms",
                     f"p50 {page['ms']['p50']:.1f} ms over {page['pages']} pages "
                     f"({page['rows_per_page']:g} runs a page on average), {shards} shards x "
                     f"{runs:,} runs; 1 shard p50 {one['p50']:.1f}, p99 {one['p99']:.1f} ms"))
    rows.append(("visibility", f"{shards} shards / 1 shard",
                 f"{v['list_page_over_single_shard']:.2f}x",
                 "median of the kinds' median pages; the 1-shard map's shard holds as many "
                 "runs"))
    rows.append(("visibility", "count_runs, by state", f"p99 {v['count_by_state_ms']:.1f} ms",
                 f"p50 {v['count_by_state_p50_ms']:.1f} ms; one workflow p99 "
                 f"{v['count_by_workflow_ms']:.1f} ms"))
    rows.append(("visibility", "sequential scans", _n(v["visibility_seq_scans"]),
                 f"of run tables over the pages; {_n(v['visibility_config_seq_scans'])} of the "
                 f"map and ownership tables (read whole by design); load "
                 f"{v['visibility_load_s']:.0f} s"))
    return rows


def ratio_lines(head: Result) -> list[str]:
    """The ratios to the floors and the ceilings a CPU-free worker would meet."""
    lines: list[str] = []
    if "shardq_over_floor" in head:
        lines.append(f"\nshardq / floor at k={head['floor_batch']}: "
                     f"{head['shardq_over_floor']:.3f}")
    if "durable_over_floor" in head:
        lines.append(f"  durable floor / floor: {head['durable_over_floor']:.3f}"
                     "  (shardq's tables and SQL with no worker: the most any worker gets)")
    if "shardq_over_durable_floor" in head:
        lines.append(f"  shardq / durable floor: {head['shardq_over_durable_floor']:.3f}"
                     "  (the worker's share)")
    ceilings = [f"{what} <= {head[key]:.3f}" for key, what in
                (("durable_pg_ceiling", "durable floor"), ("drain_pg_ceiling", "backlog drain"))
                if key in head]
    if ceilings:
        lines.append(f"  with a client that cost no CPU: {', '.join(ceilings)}  (raw floor CPU "
                     f"per job, {head['floor_cpu_us_per_job']:g} us, / shardq's PostgreSQL CPU "
                     "per job)")
    wal = [f"{what} {head[key]:.3f}" for key, what in
           (("wal_over_floor", "backlog drain"), ("durable_wal_over_floor", "durable floor"))
           if key in head]
    if wal:
        lines.append(f"WAL per job / raw floor's ({_n(head['floor_wal_bytes_per_job'])} B): "
                     + ", ".join(wal))
    cpu = [f"{what} {head[key]:.3f}" for key, what in
           (("pg_cpu_over_floor", "backlog drain"), ("durable_pg_cpu_over_floor",
                                                     "durable floor")) if key in head]
    if cpu:
        lines.append(f"PostgreSQL CPU per job / raw floor's whole-job CPU "
                     f"({_n(head['floor_cpu_us_per_job'])} us): " + ", ".join(cpu))
    return lines


def main(argv: list[str]) -> int:
    """`python -m shardq.benchmarks.report RESULT.json`: the table of a saved result.

    With `--page PAGE.md [--scaling A.json B.json ...]` it writes the documentation's
    performance page from the result instead, and its plots beside the page
    (benchmarks/page.py; the `--scaling` results, one per shard count, feed the
    scaling plot).
    """
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m shardq.benchmarks.report")
    parser.add_argument("result", type=Path, help="a result saved with --out")
    parser.add_argument("--page", type=Path, help="write the docs' performance page here")
    parser.add_argument("--scaling", type=Path, nargs="*", default=[],
                        help="results of one shard count each, for the scaling plot")
    args = parser.parse_args(argv)
    if args.page is not None:
        from shardq.benchmarks.page import write  # noqa: PLC0415

        for path in write(args.result, args.page, args.scaling, page_command(
                args.result, args.page, args.scaling)):
            print(f"wrote {path}")
        return 0
    if args.scaling:
        parser.error("--scaling goes with --page")
    doc = json.loads(args.result.read_text())
    # Derived afresh: a result saved by an older build gains the newer figures.
    head = headline(doc["scenarios"])
    print(table({**doc, "headline": head, "targets": targets(head)}))
    return 0


def page_command(result: Path, page: Path, scaling: list[Path]) -> str:
    """The command that regenerates a page, as the page states it."""
    return " ".join(["python -m shardq.benchmarks.report", result.as_posix(), "--page",
                     page.as_posix(), *(["--scaling"] if scaling else []),
                     *(p.as_posix() for p in scaling)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
