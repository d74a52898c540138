"""The demo: a checkout workflow end to end, a quorum, a fan-out across shards, and
growing from two PostgreSQL servers to three while everything runs.

Uses the shards in SHARDQ_SHARDS when set (migrating them first); otherwise
starts throw-away embedded PostgreSQL servers, one per shard, and deletes them
afterwards. A worker and an outbox relay run in this process. Prints the
routing, each run's timeline and the checkout's history. On its own servers the
demo then starts one more, adds it as a shard (`shardq shards add`) and
rebalances onto it (`shardq shards rebalance`) while runs parked on both shards
are signalled; on shards of SHARDQ_SHARDS it leaves the deployment as it is.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import click

from shardq.bin.examples import registry
from shardq.client.client import Client
from shardq.core.errors import PayloadInvalid, SignalRefused, UpdateRejected
from shardq.core.models import HistoryEvent, State
from shardq.outbox.relay import Relay
from shardq.shards.config import ENV_SHARDS, ShardMap
from shardq.shards.errors import ShardqError
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_for
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import Worker

NewServer = Callable[[str], str]
"""Starts one more throw-away server and returns the URL of a new database on it."""


@contextmanager
def demo_shards(count: int) -> Iterator[tuple[ShardMap, NewServer | None]]:
    if os.environ.get(ENV_SHARDS):
        click.echo(f"using the shards in {ENV_SHARDS}")
        yield ShardMap.from_env(), None
        return
    from shardq.shards.embedded import EmbeddedPostgres

    click.echo(f"no SHARDQ_SHARDS set: starting {count} throw-away embedded PostgreSQL "
               "servers, one per shard ...")
    with ExitStack() as servers:

        def new_server(database: str) -> str:
            server = servers.enter_context(EmbeddedPostgres())
            return server.create_database(database)

        urls = [new_server(f"shardq_demo_{i}") for i in range(count)]
        yield ShardMap.from_urls(urls), new_server
    click.echo("embedded PostgreSQL servers stopped and deleted")


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def mark(self, what: str) -> None:
        click.echo(f"  +{(time.monotonic() - self.t0) * 1000:7.1f} ms  {what}")


def wait_for_state(client: Client, execution_id: object, states: set[State]) -> State:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = client.get(str(execution_id)).state
        if state in states:
            return state
        if state.terminal:  # it will never get there: say so now, not in 30 s
            raise SystemExit(f"demo failed: execution {execution_id} is already {state.value}")
        time.sleep(0.01)
    raise SystemExit(f"demo failed: execution {execution_id} never reached "
                     f"{', '.join(sorted(states))} within 30 s")


def run_demo(shard_count: int) -> None:
    with demo_shards(shard_count) as (shard_map, new_server):
        click.echo(f"\nshard map {shard_map.fingerprint}:")
        for shard in shard_map.shards:
            click.echo(f"  {shard.name}: buckets {shard.first_bucket}-{shard.last_bucket}")
        for result in migrate(shard_map):
            click.echo(f"  migrated {result.shard.name}: schema version {result.version}")

        click.echo("\nrouting: workflow key -> bucket -> shard")
        for key in [f"order-{n}" for n in range(1001, 1009)]:
            bucket = bucket_for("default", "checkout", key)
            click.echo(f"  checkout/{key:<11} bucket {bucket:>4} -> "
                       f"{shard_map.for_bucket(bucket).name}")

        # Fresh keys per run: on shards kept between runs (SHARDQ_SHARDS) a fixed key would
        # return the previous run's finished execution, which never parks again.
        run = secrets.token_hex(3)
        key, webhook = f"order-1001-{run}", f"psp-evt-{run}"
        # Follows new map versions within half a second: the growing scene moves runs.
        pools = ShardPools(shard_map, follow_every_s=0.5).open()
        store = Store(pools)
        worker = Worker(store, registry, config=WorkerConfig(poll_interval_s=30)).start()
        relay = Relay(store).start()
        client = Client(store, registry)
        try:
            order = {"order_id": 1001, "items": [{"sku": "tea", "qty": 2}]}
            click.echo(f"\ntimeline of checkout {key}:")
            timeline = Timeline()
            started = client.start("checkout", key, order)
            home = shard_map.for_execution(started.execution_id).name
            timeline.mark(f"started   {started.execution_id} (routed by its id to {home})")
            again = client.start("checkout", key, order)
            timeline.mark(f"start again with the same key -> same run, created={again.created}")
            wait_for_state(client, started.execution_id, {State.WAITING})
            timeline.mark("parked    waiting for signal payment_captured; no process holds it")
            delivered = client.signal(
                started.execution_id, "payment_captured", {"amount": 18.5},
                idempotency_key=webhook,
            )
            timeline.mark(f"signalled payment_captured (delivered={delivered.delivered})")
            repeat = client.signal(
                started.execution_id, "payment_captured", {"amount": 18.5},
                idempotency_key=webhook,
            )
            timeline.mark(f"webhook retried with the same key (delivered={repeat.delivered})")
            final = client.wait(started.execution_id, timeout=30)
            timeline.mark(f"resumed and {final.state.value}")
            click.echo(f"\noutput: {json.dumps(final.output)}")
            click.echo("\nhistory:")
            for event in client.history(started.execution_id):
                position = "-" if event.position is None else str(event.position)
                click.echo(f"  {event.seq:>3} {position:>3} {event.kind:<16} {event.name:<18} "
                           f"{json.dumps(event.payload)}")
            if final.state is not State.COMPLETED:
                raise SystemExit(f"demo failed: the run ended {final.state.value}")
            quorum_demo(client, run)
            contract_demo(client, run)
            fan_out_demo(client, run)
            review_demo(client, run)
            grow_demo(client, run, new_server)
        finally:
            relay.stop()
            worker.stop(drain_timeout_s=5)
            pools.close()


def quorum_demo(client: Client, run: str) -> None:
    """Two approvers before a deadline: a signal-started run and a condition over signals."""
    key = f"expense-77-{run}"
    click.echo(f"\ntimeline of quorum_approval {key}:")
    timeline = Timeline()
    first = client.signal_with_start("quorum_approval", key, {"hours": 48}, "approved",
                                     {"approver": "ann"}, idempotency_key=f"ann-{run}")
    timeline.mark(f"signal-with-start: run created={first.created}, ann's approval buffered")
    again = client.signal_with_start("quorum_approval", key, {"hours": 48}, "approved",
                                     {"approver": "ann"}, idempotency_key=f"ann-{run}")
    timeline.mark(f"ann's webhook retried: created={again.created}, "
                  f"delivered={again.delivered}")
    wait_for_state(client, first.execution_id, {State.WAITING})
    timeline.mark("parked    quorum 1 of 2; no process holds it")
    client.signal(first.execution_id, "approved", {"approver": "bob"})
    final = client.wait(first.execution_id, timeout=30)
    timeline.mark(f"bob approved -> {final.state.value}: {json.dumps(final.output)}")
    if final.state is not State.COMPLETED or final.output["outcome"] != "approved":
        raise SystemExit(f"demo failed: the quorum ended {final.state.value}")


def contract_demo(client: Client, run: str) -> None:
    """A cart's published contract: updates answered once recorded, a query with no worker
    needed, and a payload refused by its schema before anything is stored."""
    key = f"cart-9-{run}"
    click.echo(f"\ntimeline of cart {key} (a class-based workflow with a contract):")
    timeline = Timeline()
    interface = client.interface("cart")
    timeline.mark("interface: " + "; ".join(
        f"{kind} {', '.join(e['name'] for e in entries)}" for kind, entries in interface.items()
        if entries))
    first = client.update_with_start("cart", key, {"customer": "ann"}, "add_item",
                                     {"sku": "tea", "quantity": 2}, idempotency_key=f"tea-{run}")
    cart = first.execution_id
    timeline.mark(f"update-with-start add_item tea: run created={first.created}, "
                  f"answer {first.response}")
    second = client.update(cart, "add_item", {"sku": "cups", "quantity": 6})
    timeline.mark(f"update add_item cups: answer {second.response} (recorded in history)")
    try:
        client.update(cart, "add_item", {"sku": "tea", "quantity": 1})
    except UpdateRejected as exc:
        timeline.mark(f"update add_item tea again: rejected by the validator ({exc})")
    try:
        client.signal(cart, "payment_captured", {"amount": -5})
    except PayloadInvalid as exc:
        timeline.mark(f"payment with amount -5 refused, nothing stored: "
                      f"{exc.violations[0]['field_path']} {exc.violations[0]['message']}")
    contents = client.query(cart, "contents")
    timeline.mark(f"query contents (replayed from history): {contents['status']}, "
                  f"{[i['sku'] for i in contents['items']]}")
    client.signal(cart, "payment_captured", {"amount": 23.0})
    final = client.wait(cart, timeout=30)
    timeline.mark(f"paid -> {final.state.value}: shipped {final.output['shipped']}")
    if final.state is not State.COMPLETED:
        raise SystemExit(f"demo failed: the cart ended {final.state.value}")


def fan_out_demo(client: Client, run: str) -> None:
    """A tenant cancelled: one run signals every onboarding run of the tenant, on every shard.

    Targets of the sender's shard get their signal in its commit; the others
    through the outbox and the relay, which records in the sender's history
    that a target had finished meanwhile.
    """
    shards = client.map.shards

    def key_on_shard(workflow: str, prefix: str, index: int) -> str:
        shard = shards[index % len(shards)]
        return next(k for k in (f"{prefix}-{run}-{i}" for i in range(100_000))
                    if client.map.for_bucket(bucket_for("default", workflow, k)) == shard)

    click.echo(f"\ntimeline of tenant_cancel over {len(shards)} shard(s):")
    timeline = Timeline()
    count = max(3, 2 * len(shards))
    users = [client.start("onboarding", key_on_shard("onboarding", f"user{n}", n)).execution_id
             for n in range(count)]
    for user in users:
        wait_for_state(client, user, {State.WAITING})
    timeline.mark(f"{count} onboarding runs parked on {len(shards)} shard(s), each waiting up "
                  "to 30 days")
    finished = users[:1] + users[-1:]  # one on the sender's shard, one elsewhere
    for user in finished:
        client.signal(user, "tenant_cancelled", {"reason": "earlier, by hand"})
        client.wait(user, timeout=30)
    timeline.mark("two were stopped by hand and finished")
    sender = client.start("tenant_cancel", key_on_shard("tenant_cancel", "cancel", 0),
                          {"runs": [str(u) for u in users], "reason": "churned"})
    done = client.wait(sender.execution_id, timeout=30)
    out = done.output
    timeline.mark(f"tenant_cancel {done.state.value}: signalled {len(out['signalled'])} in its "
                  f"commit, queued {len(out['queued'])} for the relay, skipped "
                  f"{list(out['skipped'].values())}")
    stopped = [client.wait(u, timeout=30).output for u in users if u not in finished]
    timeline.mark(f"the others: {sorted(set(stopped))} x {len(stopped)}")
    relayed_failures = wait_for_events(client, sender.execution_id, "external.failed",
                                       int(len(shards) > 1))
    timeline.mark(f"the relay skipped {[e.payload['reason_code'] for e in relayed_failures]} "
                  "(recorded in the sender's history)")
    if done.state is not State.COMPLETED or len(stopped) != count - 2:
        raise SystemExit(f"demo failed: the fan-out ended {done.state.value}")


def review_demo(client: Client, run: str) -> None:
    """Human review: two sign-offs through gates, a rejection that unwinds, a CLI decision."""
    click.echo(f"\ntimeline of expense_approval exp-{run} (declarative, two gates):")
    timeline = Timeline()
    expense = client.start("expense_approval", f"exp-{run}", {"amount": 42}).execution_id
    client.signal(expense, "finance-approval", {"by": "fin"})
    timeline.mark("finance signed first: kept until its gate")
    try:
        client.signal(expense, "finance-approval", {"by": "someone else"})
    except SignalRefused as exc:
        timeline.mark(f"a second finance signal refused ({exc.reason_code}): the first stands")
    wait_for_state(client, expense, {State.WAITING})
    client.signal(expense, "manager-approval", {"by": "mgr"})
    paid = client.wait(expense, timeout=30)
    pay = json.dumps(paid.output["steps"]["pay"])
    timeline.mark(f"manager signed -> {paid.state.value}: {pay}")

    click.echo(f"\ntimeline of deletion_plan acct-{run} (a rejection unwinds):")
    timeline = Timeline()
    plan = client.start("deletion_plan", f"acct-{run}", {"account": f"acct-{run}"}).execution_id
    wait_for_state(client, plan, {State.INPUT_REQUIRED})
    timeline.mark("planned, snapshotted, frozen; input_required: delete for good?")
    client.decide(plan, "approve_deletion", "reject", decision_id=f"dpo-{run}", actor="dpo")
    failed = client.wait(plan, timeout=30)
    undone = [e.name for e in client.history(plan)
              if e.kind == "step.completed" and e.name.startswith("compensate:")]
    timeline.mark(f"rejected by dpo -> {failed.state.value}, compensations {undone}")

    click.echo(f"\ntimeline of approval ap-{run} (decided from the command line):")
    timeline = Timeline()
    proposal = client.start("approval", f"ap-{run}", {"amount": 300}).execution_id
    client.signal(proposal, "documents_ready", {"files": 2})
    wait_for_state(client, proposal, {State.INPUT_REQUIRED})
    timeline.mark("documents arrived; input_required: manager_review")
    command = ["workflow", "decide", str(proposal), "manager_review", "--action", "edit",
               "--payload-json", '{"amount": 250, "reason": "capped"}',
               "--decision-id", f"mia-{run}", "--actor", "mia"]
    click.echo(f"  $ shardq {' '.join(shlex.quote(c) for c in command)}")
    env = {**os.environ, ENV_SHARDS: ",".join(s.url for s in client.map.shards)}
    decided = subprocess.run([sys.executable, "-m", "shardq.bin.cli", *command], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    click.echo(f"  {(decided.stdout or decided.stderr).strip()}")
    done = client.wait(proposal, timeout=30)
    timeline.mark(f"after the cool-down -> {done.state.value}: "
                  f"{json.dumps(done.output['steps']['commit'])}")
    if (paid.state is not State.COMPLETED or failed.state is not State.FAILED
            or done.state is not State.COMPLETED or decided.returncode != 0):
        raise SystemExit("demo failed: the review runs did not end as expected")


GROW_RUNS = 200
"""Runs parked across the shards before the demo grows: the rebalance moves some."""


def grow_demo(client: Client, run: str, new_server: NewServer | None) -> None:
    """A third server added and runs rebalanced onto it while a worker, a relay and a
    client signalling the parked runs go on; the commands as an operator types them."""
    click.echo("\ngrowing: one more PostgreSQL server, a shard on it, runs rebalanced")
    if new_server is None:
        click.echo(f"  skipped: the demo adds shards to its own servers only, not to "
                   f"{ENV_SHARDS}'s (README: Growing: adding shards)")
        return
    timeline = Timeline()
    runs = [r.execution_id for r in client.start_many(
        "park", [(f"grow-{run}-{i}", None) for i in range(GROW_RUNS)])]
    for execution_id in runs:
        wait_for_state(client, execution_id, {State.WAITING})
    timeline.mark(f"{GROW_RUNS} runs parked on {_per_shard(client, runs)}")
    name = f"shard-{len(client.map.shards)}"
    url = new_server(f"shardq_demo_{len(client.map.shards)}")
    added = _shardq(client, "shards", "add", name, url)
    timeline.mark(f"a new server started; {added.splitlines()[-1]}")
    signals = _Signals(client, runs)
    signals.thread.start()
    moved = _shardq(client, "--json", "shards", "rebalance", "--grace", "1")
    signals.done.set()
    signals.thread.join(30)
    for move in json.loads(moved)["moves"]:
        first, last = move["buckets"]
        timeline.mark(f"moved buckets {first}-{last} {move['source']} -> {move['target']}: "
                      f"{move['runs_moved']} runs in {len(move['batches'])} batch(es), "
                      f"each paused at most {move['max_pause_ms']} ms")
    timeline.mark(f"meanwhile {signals.sent} signals to parked runs, {len(signals.errors)} "
                  f"errors, the slowest call {signals.slowest * 1000:.0f} ms")
    for execution_id in runs[signals.sent:]:
        client.signal(execution_id, "go", {"late": True})
    done = [client.wait(execution_id, timeout=30).state for execution_id in runs]
    timeline.mark(f"all {done.count(State.COMPLETED)} completed by the same worker; the runs "
                  f"are on {_per_shard(client, runs)}")
    if signals.errors or done.count(State.COMPLETED) != GROW_RUNS:
        raise SystemExit(f"demo failed: growing: {signals.errors[:3]}")


class _Signals:
    """`go` to the parked runs, one call at a time, until told to stop."""

    def __init__(self, client: Client, runs: list[uuid.UUID]) -> None:
        self.client, self.runs = client, runs
        self.sent = 0
        self.slowest = 0.0
        self.errors: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        for execution_id in self.runs:
            if self.done.is_set():
                return
            t = time.monotonic()
            try:
                self.client.signal(execution_id, "go", {"n": self.sent},
                                   idempotency_key=f"grow-{execution_id}")
            except ShardqError as exc:
                self.errors.append(str(exc))
            self.slowest = max(self.slowest, time.monotonic() - t)
            self.sent += 1
            time.sleep(0.025)  # spread over the rebalance


def _per_shard(client: Client, runs: list[uuid.UUID]) -> str:
    counts = {s.name: 0 for s in client.map.shards}
    for execution_id in runs:
        counts[client.map.for_execution(execution_id).name] += 1
    return ", ".join(f"{n} {c}" for n, c in counts.items())


def _shardq(client: Client, *command: str) -> str:
    """Run `shardq COMMAND` as an operator would, printing the command; its output."""
    shown = [c if "://" not in c else "<url>" for c in command if c != "--json"]
    click.echo(f"  $ shardq {' '.join(shlex.quote(c) for c in shown)}")
    env = {**os.environ, ENV_SHARDS: ",".join(s.url for s in client.map.seeds.shards)}
    done = subprocess.run([sys.executable, "-m", "shardq.bin.cli", *command], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise SystemExit(f"demo failed: shardq {' '.join(command)}: "
                         f"{(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


def wait_for_events(
    client: Client, execution_id: object, kind: str, expected: int
) -> list[HistoryEvent]:
    """The relay's events of `kind` in the run's history, once there are `expected` of them."""
    deadline = time.monotonic() + 30
    while True:
        # Not tied to a call (no position): written by the relay, not by the run.
        found = [e for e in client.history(str(execution_id))
                 if e.kind == kind and e.position is None]
        if len(found) >= expected:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"demo failed: {len(found)} {kind} event(s), expected {expected}")
        time.sleep(0.02)


@click.command()
@click.option("--shard-count", default=2, show_default=True,
              help="Embedded servers to start with, one shard each (one more is added).")
def main(shard_count: int) -> None:
    """Run the checkout demo."""
    try:
        run_demo(shard_count)
    except (ShardqError, TimeoutError) as exc:
        click.echo(f"shardq demo: error: {exc}", err=True)
        sys.exit(1)
    click.echo("\ndemo finished")


if __name__ == "__main__":
    main()
