"""Bad command-line input: one line on stderr, the documented exit code, nothing stored.

The rule (bin/cli/common.py's docstring): a value the command line cannot parse is a usage error,
exit 2; a well-formed request the engine refuses is exit 7. The cases run as real `shardq`
processes, in parallel (each costs about half a second), against one pair of migrated
shards whose row counts are compared before and after all of them.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shardq.client.client import Client
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate

from ..app import registry
from ..conftest import Server
from ..support import all_rows, run_cli

APP = "shardq.tests.app:registry"
DEEP = "[" * 2500 + "]" * 2500
COUNTED = ("executions", "signals", "history", "tasks", "waits", "outbox")


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    code: int
    says: str
    """A fragment the one line on stderr must contain."""
    env: dict[str, str] = field(default_factory=dict)
    stdin: str | None = None


def write_files(folder: Path) -> None:
    """The files the cases name as {dir}/...: inputs, shard maps and broken applications."""
    (folder / "deep.json").write_text(DEEP)
    (folder / "repeated.json").write_text('{"lines": [{"sku": "a", "sku": "b"}]}')
    shard = '[[shards]]\nurl = "postgresql://h/db"\n'
    (folder / "latin1.toml").write_bytes(f'{shard}name = "caf'.encode() + b'\xe9"\n')
    (folder / "bucket.toml").write_text(f"{shard}bucket = [0, 4095]\n")
    (folder / "sise.toml").write_text(f"[pool]\nmax_sise = 3\n{shard}")
    (folder / "lots.toml").write_text(f'{shard}max_size = "lots"\n')
    (folder / "boom_app.py").write_text("raise RuntimeError('no config for boom')\n")
    (folder / "broken_app.py").write_text("def oops(:\n    pass\n")
    good = "acme sha256:" + "0" * 64
    (folder / "tokens.ok").write_text(good + "\n")
    (folder / "tokens.bad").write_text(f"{good}\nacme notahash\n")
    (folder / "tokens.empty").write_text("# nobody\n")


APPS = {"PYTHONPATH": "{dir}"}
START = ("workflow", "start", "checkout")
SIGNAL = ("workflow", "signal", "{run}", "payment_captured")
UNKNOWN_ID = "01a23b00-a581-8495-a55e-808a42654d6c"
DECIDE = ("workflow", "decide", "{run}", "manager_review", "--decision-id", "d1",
          "--actor", "ann")

QUERY = ("workflow", "query", "{cart}", "contents")
UPDATE = ("workflow", "update", "{cart}", "add_item")
ITEM = '{"sku": "pen", "quantity": 1}'

SERVE = ("serve", "--app", APP, "--tokens-file", "{dir}/tokens.ok", "--port", "{busy}")
FLOAT_OPTIONS: list[tuple[tuple[str, ...], str]] = [
    # (the command, its float option): every one there is, each refusing the same values
    (("worker", "--app", APP), "--lease"),
    (("worker", "--app", APP), "--poll-interval"),
    (("worker", "--app", APP), "--drain-timeout"),
    (("worker", "--app", APP), "--housekeeping-interval"),
    (("worker", "--app", APP), "--default-retention"),
    (("outbox-relay",), "--poll-interval"),
    (("outbox-relay",), "--max-age"),
    (("outbox-relay",), "--max-backoff"),
    (("outbox-relay",), "--delivery-timeout"),
    ((*UPDATE, "--arg", ITEM, "--app", APP), "--wait"),
    (("workflow", "update-with-start", "cart", "c8", "add_item", "--input",
      '{"customer": "c"}', "--arg", ITEM, "--app", APP), "--wait"),
    (("metrics", "--port", "9"), "--overdue-grace"),
    (("metrics", "--port", "9"), "--deadline-grace"),
    (("metrics", "--port", "9"), "--scrape-timeout"),
    (("metrics", "--port", "9"), "--cache-seconds"),
    (("stale",), "--deadline-grace"),
    (("purge", "--app", APP), "--default-retention"),
    (SERVE, "--inbox-stale-after"),
]
FLOAT_CASES = [
    Case(f"{command[0] if command[0] != 'workflow' else command[1]}{option}-{bad}",
         (*command, option, bad), 2,
         f"Invalid value for '{option}': '{bad}' is not a finite number of seconds")
    for command, option in FLOAT_OPTIONS for bad in ("nan", "inf", "-inf", "-5", "NaN")
]
"""nan and inf reached timers and the database before (a worker with --lease nan ran
forever claiming nothing); every float option refuses them before anything starts."""

CASES = [
    # -- usage errors: exit 2 --------------------------------------------------
    Case("query-bad-id", ("workflow", "query", "nope", "contents", "--app", APP), 2,
         "not an execution id"),
    Case("query-bad-arg", (*QUERY, "--arg", "{", "--app", APP), 2, "is not valid JSON"),
    Case("update-empty-key", (*UPDATE, "--arg", ITEM, "--idempotency-key", "", "--app", APP),
         2, "is empty"),
    Case("update-bad-wait", (*UPDATE, "--arg", ITEM, "--wait", "601", "--app", APP), 2,
         "'601' is not a finite number of seconds >= 0 and <= 600"),
    Case("update-no-app", (*UPDATE, "--arg", ITEM), 2, "no workflow registry"),
    Case("interface-no-app", ("workflow", "interface", "cart"), 2, "no workflow registry"),
    Case("deep-input", (*START, "k1", "--input", DEEP, "--app", APP), 2, "nested too deeply"),
    *[Case(f"start-priority-{name}", (*START, "k1", "--priority", bad, "--app", APP), 2,
           says)
      for name, bad, says in (
          ("negative", "-1", "priority must be a whole number within 0..9"),
          ("ten", "10", "priority must be a whole number within 0..9"),
          ("huge", str(2**70), "priority must be a whole number within 0..9"),
          ("fraction", "1.5", "'1.5' is not a valid integer"),
          ("word", "high", "'high' is not a valid integer"),
          ("nan", "nan", "'nan' is not a valid integer"),
      )],
    Case("signal-with-start-priority", ("workflow", "signal-with-start", "checkout", "k1",
                                        "payment_captured", "--priority", "12", "--app", APP),
         2, "priority must be a whole number within 0..9"),
    Case("list-priority", ("workflow", "list", "--priority", "-3"), 2,
         "priority must be a whole number within 0..9"),
    Case("set-priority-ten", ("workflow", "set-priority", UNKNOWN_ID, "10"), 2,
         "priority must be a whole number within 0..9"),
    Case("set-priority-word", ("workflow", "set-priority", UNKNOWN_ID, "high"), 2,
         "'high' is not a valid integer"),
    Case("set-priority-missing", ("workflow", "set-priority", UNKNOWN_ID), 2,
         "Missing argument"),
    Case("set-priority-bad-id", ("workflow", "set-priority", "nope", "3"), 2,
         "not an execution id"),
    Case("deep-payload-file", (*SIGNAL, "--payload", "@{dir}/deep.json"), 2,
         "nested too deeply"),
    Case("deep-payload-stdin", (*SIGNAL, "--payload", "-"), 2, "nested too deeply",
         stdin=DEEP),
    Case("nan", (*START, "k1", "--input", '{"a": NaN}', "--app", APP), 2, "NaN"),
    Case("huge-number", (*START, "k1", "--input", "[1e999]", "--app", APP), 2,
         "out of range"),
    Case("bad-json", (*START, "k1", "--input", "{", "--app", APP), 2, "not valid JSON"),
    # A key twice in one object: json.loads would keep the last, silently.
    Case("repeated-key-input", (*START, "k1", "--input", '{"a": 1, "a": 2}', "--app", APP),
         2, "Invalid value for '--input': repeats the key 'a' in one object"),
    Case("repeated-key-payload-file", (*SIGNAL, "--payload", "@{dir}/repeated.json"), 2,
         "repeats the key 'sku' in one object"),
    Case("repeated-key-payload-stdin", (*SIGNAL, "--payload", "-"), 2,
         "repeats the key 'b' in one object", stdin='{"a": {"b": 1, "b": 2}}'),
    Case("repeated-key-decision", (*DECIDE, "--action", "edit", "--payload-json",
                                   '{"amount": 5, "reason": "r", "amount": 6}'), 2,
         "repeats the key 'amount' in one object"),
    Case("repeated-key-query", (*QUERY, "--arg", '{"a": 1, "a": 2}', "--app", APP), 2,
         "Invalid value for '--arg': repeats the key 'a' in one object"),
    Case("repeated-key-update", (*UPDATE, "--arg", '{"sku": "p", "quantity": 1, '
                                 '"quantity": 2}', "--app", APP), 2,
         "repeats the key 'quantity' in one object"),
    Case("repeated-key-signal-with-start", ("workflow", "signal-with-start", "park", "k6", "go",
                                            "--payload", '{"n": 1, "n": 2}', "--app", APP),
         2, "repeats the key 'n' in one object"),
    Case("repeated-key-update-with-start", ("workflow", "update-with-start", "cart", "c9",
                                            "add_item", "--input",
                                            '{"customer": "c", "customer": "d"}', "--arg",
                                            ITEM, "--app", APP), 2,
         "repeats the key 'customer' in one object"),
    Case("missing-input-file", (*START, "k1", "--input", "@/no/such.json", "--app", APP), 2,
         "No such file"),
    Case("bad-state", ("workflow", "list", "--state", "bogus"), 2, "'bogus' is not one of"),
    Case("count-empty-workflow", ("workflow", "count", "--workflow", ""), 2, "workflow"),
    Case("count-long-tenant", ("workflow", "count", "--tenant", "t" * 300), 2, "tenant"),
    Case("list-window-words", ("workflow", "list", "--created-after", "last week"), 2,
         "'last week' is not an ISO 8601 time"),
    Case("list-window-naive", ("workflow", "list", "--created-before", "2026-12-01T00:00"), 2,
         "has no offset"),
    Case("list-where-typo", ("workflow", "list", "--where", "amount>>3"), 2,
         "is not NAME OP VALUE"),
    Case("list-where-long", ("workflow", "list", "--where", "region=" + "x" * 300), 2,
         "at most 256 characters"),
    Case("list-where-five", ("workflow", "list", *(a for i in range(5)
                                                  for a in ("--where", f"a{i}=1"))), 2,
         "at most 4 attribute filters"),
    Case("count-where-infinite", ("workflow", "count", "--where", "amount=1e999"), 2,
         "a finite number"),
    Case("bulk-no-filter", ("workflow", "cancel-matching"), 7, "a bulk action needs a filter"),
    Case("bulk-bound-zero", ("workflow", "cancel-matching", "--workflow", "checkout",
                             "--max-runs", "0"), 7, "max_runs must be a whole number"),
    Case("bulk-over-bound", ("workflow", "cancel-matching", "--state", "pending",
                             "--max-runs", "1"), 7, "more than 1 live runs match; nothing"),
    Case("bulk-signal-over-bound", ("workflow", "signal-matching", "go", "--state", "pending",
                                    "--max-runs", "1", "--json"), 7, "more than 1 live runs"),
    Case("bulk-ended-state", ("workflow", "signal-matching", "go", "--state", "completed"), 2,
         "'completed' is not one of"),
    Case("bulk-bad-payload", ("workflow", "signal-matching", "go", "--workflow", "checkout",
                              "--payload", "{"), 2, "is not valid JSON"),
    Case("bulk-bad-where", ("workflow", "cancel-matching", "--where", "=1"), 2,
         "is not NAME OP VALUE"),
    Case("bad-cursor", ("workflow", "list", "--cursor", "xyz"), 2, "is not a cursor"),
    Case("limit-zero", ("workflow", "list", "--limit", "0"), 2, "not within 1..1000"),
    Case("limit-text", ("workflow", "list", "--limit", "lots"), 2, "not a valid integer"),
    Case("bad-execution-id", ("workflow", "show", "nope"), 2, "not an execution id"),
    Case("no-app", (*START, "k1"), 2, "pass --app module:attribute or set SHARDQ_APP"),
    Case("empty-app", (*START, "k1", "--app", ""), 2, "pass --app module:attribute"),
    Case("path-as-app", (*START, "k1", "--app", "../etc:x"), 2, "is not module:attribute"),
    Case("app-raises", (*START, "k1", "--app", "boom_app:registry"), 2,
         "RuntimeError: no config for boom", env=APPS),
    Case("app-syntax-error", (*START, "k1", "--app", "broken_app:registry"), 2,
         "SyntaxError", env=APPS),
    Case("worker-no-app", ("worker",), 2, "pass --app"),
    Case("shards-not-utf8", ("--shards-file", "{dir}/latin1.toml", "workflow", "list"),
         2, "is not UTF-8 text"),
    Case("shards-bucket-typo", ("--shards-file", "{dir}/bucket.toml", "shards"), 2,
         "unknown key 'bucket' (did you mean 'buckets'?)"),
    Case("shards-max-sise", ("--shards-file", "{dir}/sise.toml", "shards"), 2,
         "unknown key 'max_sise'"),
    Case("shards-max-size-lots", ("--shards-file", "{dir}/lots.toml", "shards"), 2,
         "max_size must be an integer, got 'lots'"),
    Case("pooler-not-a-url", ("workflow", "list"), 2,
         "SHARDQ_POOLER must be a postgresql://host:port URL", env={"SHARDQ_POOLER": "pgb"}),
    Case("pooler-with-database", ("workflow", "count"), 2, "the pooler's address alone",
         env={"SHARDQ_POOLER": "postgresql://127.0.0.1:6432/shard0"}),
    Case("json-usage", ("workflow", "list", "--limit", "0", "--json"), 2, "1..1000"),
    Case("relay-batch-zero", ("outbox-relay", "--batch-size", "0"), 2,
         "batch size must be 1..10000"),
    Case("relay-batch-text", ("outbox-relay", "--batch-size", "lots"), 2, "not a valid integer"),
    Case("relay-poll-zero", ("outbox-relay", "--poll-interval", "0"), 2,
         "'0' is not a finite number of seconds > 0"),
    Case("relay-poll-tiny", ("outbox-relay", "--poll-interval", "0.01"), 2,
         "poll interval must be at least 0.1 s"),
    Case("relay-unknown-shard", ("outbox-relay", "--shard", "nope"), 2, "unknown shard nope"),
    Case("retry-no-shard", ("outbox", "retry", "1"), 2, "Missing option '--shard'"),
    Case("retry-no-id", ("outbox", "retry", "--shard", "shard-0"), 2, "Missing argument"),
    Case("retry-id-zero", ("outbox", "retry", "--shard", "shard-0", "0"), 2,
         "0 is not in the range 1<=x"),
    Case("retry-id-huge", ("outbox", "retry", "--shard", "shard-0", "9" * 20), 2,
         "1<=x<=9223372036854775807"),
    Case("retry-id-text", ("outbox", "retry", "--shard", "shard-0", "x"), 2,
         "not a valid integer"),
    Case("retry-unknown-shard", ("outbox", "retry", "--shard", "nope", "1"), 2,
         "unknown shard nope"),
    Case("failed-limit-zero", ("outbox", "failed", "--limit", "0"), 2, "not within 1..1000"),
    Case("failed-unknown-shard", ("outbox", "failed", "--shard", "nope"), 2, "unknown shard"),
    Case("decide-bad-action", (*DECIDE, "--action", "maybe"), 2, "'maybe' is not one of"),
    Case("decide-cancel-action", (*DECIDE, "--action", "cancel"), 2, "'cancel' is not one of"),
    Case("decide-no-decision-id", ("workflow", "decide", "{run}", "manager_review", "--action",
                                   "approve", "--actor", "ann"), 2, "Missing option"),
    Case("decide-no-actor", ("workflow", "decide", "{run}", "manager_review", "--action",
                             "approve", "--decision-id", "d"), 2, "Missing option '--actor'"),
    Case("decide-bad-payload", (*DECIDE, "--action", "edit", "--payload-json", "{"), 2,
         "not valid JSON"),
    Case("decide-bad-id", ("workflow", "decide", "nope", "x", "--action", "approve",
                           "--decision-id", "d", "--actor", "a"), 2, "not an execution id"),
    Case("pending-bad-cursor", ("workflow", "pending", "--cursor", "zz"), 2, "is not a cursor"),
    Case("pending-limit-zero", ("workflow", "pending", "--limit", "0"), 2, "not within 1..1000"),
    Case("metrics-no-port", ("metrics",), 2, "Missing option '--port'"),
    Case("metrics-port-zero", ("metrics", "--port", "0"), 2, "not in the range 1<=x<=65535"),
    Case("metrics-port-busy", ("metrics", "--port", "{busy}"), 2, "cannot serve metrics on"),
    Case("metrics-bound-shape", ("metrics", "--port", "9", "--stale-after", "signal"), 2,
         "expected KIND=SECONDS"),
    Case("metrics-bound-kind", ("metrics", "--port", "9", "--stale-after", "nap=5"), 2,
         "expected KIND=SECONDS with KIND one of"),
    Case("metrics-bound-negative", ("metrics", "--port", "9", "--stale-after", "signal=-1"), 2,
         "positive number of seconds"),
    Case("metrics-bound-nan", ("metrics", "--port", "9", "--stale-after", "signal=nan"), 2,
         "positive number of seconds"),
    Case("metrics-timeout-zero", ("metrics", "--port", "9", "--scrape-timeout", "0"), 2,
         "'0' is not a finite number of seconds >= 0.1 and <= 120"),
    Case("worker-metrics-port-text", ("worker", "--app", APP, "--metrics-port", "x"), 2,
         "not a valid integer"),
    Case("relay-metrics-port-busy", ("outbox-relay", "--metrics-port", "{busy}"), 2,
         "cannot serve metrics on"),
    Case("stale-bad-kind", ("stale", "--kind", "nap"), 2, "'nap' is not one of"),
    Case("serve-no-tokens", ("serve", "--app", APP, "--port", "{busy}"), 2,
         "Missing option '--tokens-file'"),
    Case("serve-tokens-missing", ("serve", "--app", APP, "--tokens-file", "{dir}/none"), 2,
         "cannot read tokens file"),
    Case("serve-tokens-bad-line", ("serve", "--app", APP, "--tokens-file", "{dir}/tokens.bad"),
         2, "tokens.bad:2: expected `TENANT sha256:HEX`"),
    Case("serve-tokens-empty", ("serve", "--app", APP, "--tokens-file", "{dir}/tokens.empty"),
         2, "no tokens"),
    Case("serve-port-busy", ("serve", "--app", APP, "--tokens-file", "{dir}/tokens.ok",
                             "--port", "{busy}"), 2, "cannot listen on"),
    Case("serve-no-workers", ("serve", "--app", APP, "--tokens-file", "{dir}/tokens.ok",
                              "--workers", "0"), 2, "not in the range"),
    Case("serve-busy-port-many-workers", ("serve", "--app", APP, "--tokens-file",
                                          "{dir}/tokens.ok", "--port", "{busy}", "--workers",
                                          "3"), 2, "cannot listen"),
    Case("serve-port-zero", ("serve", "--app", APP, "--tokens-file", "{dir}/tokens.ok",
                             "--port", "0"), 2, "not in the range 1<=x<=65535"),
    Case("purge-no-app", ("purge",), 2, "pass --app"),
    Case("purge-retention-zero", ("purge", "--app", APP, "--default-retention", "0"), 2,
         "--default-retention"),
    Case("purge-retention-text", ("purge", "--app", APP, "--default-retention", "month"), 2,
         "'month' is not a finite number of seconds"),
    Case("purge-unknown-shard", ("purge", "--app", APP, "--shard", "nope", "--dry-run"), 2,
         "unknown shard"),
    Case("worker-poll-tiny", ("worker", "--app", APP, "--poll-interval", "0.01"), 2,
         "poll interval must be at least 0.1 s"),
    Case("worker-housekeeping-negative", ("worker", "--app", APP, "--housekeeping-interval",
                                          "-1"), 2, "--housekeeping-interval"),
    Case("stale-limit-zero", ("stale", "--limit", "0"), 2, "not within 1..1000"),
    *[Case(f"start-concurrency-{name}", (*START, "k1", "--concurrency", bad, "--app", APP), 2,
           says) for name, bad, says in (
          ("zero", "acct=0", "within 1..1000000"),
          ("negative", "acct=-2", "within 1..1000000"),
          ("huge", "acct=99999999999", "within 1..1000000"),
          ("nan", "acct=nan", "is not KEY=LIMIT"),
          ("no-limit", "acct", "is not KEY=LIMIT"),
          ("empty-key", "=3", "non-empty string"),
          ("long-key", "k" * 10_240 + "=1", "at most 255 characters"),
      )],
    Case("limits-set-zero", ("limits", "set", "k", "0"), 2, "within 1..1000000"),
    Case("limits-set-negative", ("limits", "set", "k", "--", "-1"), 2, "within 1..1000000"),
    Case("limits-set-huge", ("limits", "set", "k", "10000000000"), 2, "within 1..1000000"),
    Case("limits-set-nan", ("limits", "set", "k", "nan"), 2, "'nan' is not a valid integer"),
    Case("limits-set-missing", ("limits", "set", "k"), 2, "Missing argument"),
    Case("limits-set-empty-key", ("limits", "set", "", "1"), 2, "non-empty string"),
    Case("limits-set-long-key", ("limits", "set", "k" * 10_240, "1"), 2,
         "at most 255 characters"),
    Case("limits-show-surrogate-key", ("limits", "show", "k\udcff"), 2, "lone surrogate"),
    Case("limits-list-zero", ("limits", "list", "--limit", "0"), 2, "not within 1..1000"),
    *FLOAT_CASES,
    # -- refused by the engine: exit 7 ----------------------------------------
    Case("nul-input", (*START, "k2", "--input", '{"a": "x\\u0000y"}', "--app", APP), 7,
         "the string at $.a contains a NUL character"),
    Case("surrogate-input", (*START, "k3", "--input", '["\\ud800"]', "--app", APP), 7,
         "the string at $[0] contains a lone surrogate"),
    # A command-line byte that is not UTF-8 reaches Python as a lone surrogate.
    Case("surrogate-workflow-id", (*START, "k\udcff", "--app", APP), 7,
         "workflow_id contains a lone surrogate"),
    Case("surrogate-tenant", (*START, "k4", "--tenant", "t\udcff", "--app", APP), 7,
         "tenant name"),
    Case("nul-payload", (*SIGNAL, "--payload", '"\\u0000"'), 7, "NUL character"),
    Case("surrogate-key", (*SIGNAL, "--idempotency-key", "k\udcff"), 7,
         "idempotency_key contains a lone surrogate"),
    Case("unknown-workflow", ("workflow", "start", "nope", "k5", "--app", APP), 7,
         "unknown workflow"),
    Case("not-found", ("workflow", "show", UNKNOWN_ID), 7, "not found"),
    Case("json-refusal", ("workflow", "cancel", UNKNOWN_ID, "--json"), 7, "not found"),
    Case("set-priority-unknown-run", ("workflow", "set-priority", UNKNOWN_ID, "3"), 7,
         "not found"),
    Case("limits-show-unknown-key", ("limits", "show", "nobody"), 7, "is not known"),
    Case("limits-set-unknown-key", ("limits", "set", "nobody", "2"), 7, "is not known"),
    Case("limits-reset-unknown-key", ("limits", "reset", "nobody"), 7, "is not known"),
    Case("decide-empty-actor", (*DECIDE, "--action", "approve", "--actor", " "), 7,
         "actor must be a non-empty string"),
    Case("decide-long-decision-id", (*DECIDE, "--action", "approve", "--decision-id", "d" * 300),
         7, "decision_id must be a non-empty string of at most 255"),
    Case("decide-bad-interrupt-name", (*DECIDE[:3], "no such!", *DECIDE[4:], "--action",
                                       "approve"), 7, "interrupt name"),
    Case("decide-unknown-run", ("workflow", "decide", UNKNOWN_ID, "manager_review", "--action",
                                "approve", "--decision-id", "d", "--actor", "a"), 7,
         "not found"),
    Case("pending-bad-workflow", ("workflow", "pending", "--workflow", "bad name!"), 7,
         "workflow name"),
    Case("stale-bad-workflow", ("stale", "--workflow", "bad name!"), 7, "workflow name"),
    Case("api-token-bad-tenant", ("api-token", "a b"), 7, "tenant name"),
    Case("interface-unknown", ("workflow", "interface", "nope", "--app", APP), 7,
         "unknown workflow"),
    Case("query-unknown-handler", (*QUERY[:3], "nope", "--app", APP), 7,
         "has no query named 'nope'"),
    Case("query-unknown-run", ("workflow", "query", UNKNOWN_ID, "contents", "--app", APP), 7,
         "not found"),
    Case("update-breaks-schema", (*UPDATE, "--arg", '{"sku": ""}', "--app", APP), 7,
         "does not match its schema"),
    Case("update-unknown-handler", (*UPDATE[:3], "nope", "--app", APP), 7,
         "has no update named 'nope'"),
    Case("update-with-start-bad-input", ("workflow", "update-with-start", "cart", "c9",
                                         "add_item", "--input", "{}", "--arg", ITEM, "--app",
                                         APP), 7, "does not match its schema"),
    Case("signal-breaks-schema", ("workflow", "signal", "{cart}", "payment_captured",
                                  "--payload", '{"amount": 0}', "--app", APP), 7,
         "does not match its schema"),
    Case("start-breaks-input-schema", ("workflow", "start", "cart", "c9", "--input", "{}",
                                       "--app", APP), 7, "does not match its schema"),
    Case("retry-not-failed", ("outbox", "retry", "--shard", "shard-0", "1", "2"), 7,
         "no failed outbox row 1, 2 on shard-0: nothing re-queued"),
]


@dataclass
class Outcome:
    results: dict[str, subprocess.CompletedProcess[str]]
    counts_before: dict[str, int]
    counts_after: dict[str, int]


def _counts(shard_map: ShardMap) -> dict[str, int]:
    return {t: sum(n for (n,) in all_rows(shard_map, f"SELECT count(*) FROM shardq.{t}"))
            for t in COUNTED}


@pytest.fixture(scope="module")
def cli_map(pg_server: Server) -> ShardMap:
    shard_map = ShardMap.from_urls(pg_server.create_databases(2, tag="cli"))
    migrate(shard_map)
    return shard_map


@pytest.fixture(scope="module")
def outcome(cli_map: ShardMap, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    with Client.connect(cli_map, registry) as client:
        run = client.start("checkout", "target", {"order_id": 1, "items": []})
        cart = client.start("cart", "target", {"customer": "ann"})
    env = {"SHARDQ_SHARDS": ",".join(s.url for s in cli_map.shards)}
    folder = tmp_path_factory.mktemp("cli-inputs")
    write_files(folder)

    busy = socket.socket()  # a port something already listens on
    busy.bind(("127.0.0.1", 0))
    busy.listen()

    def fill(text: str) -> str:
        return (text.replace("{dir}", str(folder)).replace("{run}", str(run.execution_id))
                .replace("{cart}", str(cart.execution_id))
                .replace("{busy}", str(busy.getsockname()[1])))

    def run_case(case: Case) -> subprocess.CompletedProcess[str]:
        extra = {k: fill(v) for k, v in case.env.items()}
        args = [fill(a) for a in case.args]
        try:
            return run_cli(*args, env={**env, **extra}, stdin=case.stdin, timeout=30)
        except subprocess.TimeoutExpired:  # e.g. a worker that did not refuse to start
            return subprocess.CompletedProcess(args, -1, "", "timed out after 30 s")

    before = _counts(cli_map)
    with ThreadPoolExecutor(8) as pool:
        results = dict(zip([c.id for c in CASES], pool.map(run_case, CASES), strict=True))
    busy.close()
    yield Outcome(results, before, _counts(cli_map))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_is_one_line_and_its_exit_code(case: Case, outcome: Outcome) -> None:
    result = outcome.results[case.id]
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.returncode == case.code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    if "--json" in case.args:
        error = json.loads(lines[0])
        assert error["code"] == case.code
        assert case.says in error["error"]
    else:
        assert lines[0].startswith("shardq: error: ")
        assert case.says in lines[0]
    assert result.stdout == ""


def test_no_bad_input_stored_anything(outcome: Outcome) -> None:
    assert outcome.counts_after == outcome.counts_before


def test_verbose_and_json_after_the_command(cli_map: ShardMap) -> None:
    env = {"SHARDQ_SHARDS": ",".join(s.url for s in cli_map.shards)}
    result = run_cli("workflow", "list", "--limit", "1", "-v", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert "next_cursor" in json.loads(result.stdout)


def test_input_from_a_file_and_from_stdin(cli_map: ShardMap, tmp_path: Path) -> None:
    env = {"SHARDQ_SHARDS": ",".join(s.url for s in cli_map.shards), "SHARDQ_APP": APP}
    big = {"order_id": 7, "items": [{"sku": f"sku-{i}", "qty": 1} for i in range(5_000)]}
    # ~150 kB: more than the 128 kB Linux allows one command-line argument.
    (tmp_path / "order.json").write_text(json.dumps(big))
    from_file = run_cli("workflow", "start", "checkout", "from-file", "--input",
                        f"@{tmp_path / 'order.json'}", "--json", env=env)
    from_stdin = run_cli("workflow", "start", "checkout", "from-stdin", "--input", "-",
                         "--json", env=env, stdin=json.dumps({"order_id": 8, "items": []}))
    with Client.connect(cli_map, registry) as client:
        for result, expected in ((from_file, big), (from_stdin, {"order_id": 8, "items": []})):
            assert result.returncode == 0, result.stderr
            started = json.loads(result.stdout)["execution_id"]
            assert client.get(started).input == expected
