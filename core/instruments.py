"""The daemons' own Prometheus metrics: what the worker and the relay did, as it happens.

They live in REGISTRY, not prometheus-client's global one, so an application
that embeds a Worker keeps its own metrics apart; `shardq worker
--metrics-port` and `shardq outbox-relay --metrics-port` serve it. Label sets
are small (shard, outcome, source of a wake-up), never an execution id.
Children are bound once per shard or outcome (`labels()` is a dictionary
lookup under a lock): the hot path pays an increment.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

CLAIMS = Counter("shardq_worker_claims", "Claim statements run", ["shard"],
                 registry=REGISTRY)
CLAIMED = Counter("shardq_worker_claimed_runs", "Runs leased by claims", ["shard"],
                  registry=REGISTRY)
CLAIM_BATCH = Histogram("shardq_worker_claim_batch_size", "Runs leased per claim statement",
                        ["shard"], buckets=(0, 1, 2, 5, 10, 20, 50, 100, 200, 500),
                        registry=REGISTRY)
WAKEUPS = Counter("shardq_worker_wakeups",
                  "Claim loop wake-ups: by a NOTIFY or a poke (notify), or by its timer or "
                  "safety poll (timer)", ["shard", "source"], registry=REGISTRY)
TURNS = Counter("shardq_worker_turns", "Turns by how they ended", ["outcome"],
                registry=REGISTRY)
TURN_SECONDS = Histogram("shardq_worker_turn_seconds",
                         "One turn: replay, the workflow's code and its checkpoints",
                         buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                  0.5, 1.0, 2.5, 5.0, 10.0, 30.0), registry=REGISTRY)
STEP_ATTEMPTS = Counter("shardq_worker_step_attempts",
                        "Step attempts run: completed, retried (a durable backoff follows) or "
                        "failed (for good)", ["outcome"], registry=REGISTRY)
STEP_SECONDS = Histogram("shardq_worker_step_seconds", "One step attempt's function",
                         buckets=(0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                                  2.5, 5.0, 10.0, 30.0, 60.0), registry=REGISTRY)
COMMIT_BATCH = Histogram("shardq_worker_commit_batch_size",
                         "Turn commits per group commit", ["shard"],
                         buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500), registry=REGISTRY)
COMMIT_SECONDS = Histogram("shardq_worker_commit_seconds",
                           "Group commit latency, retries included", ["shard"],
                           buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                    0.5, 1.0, 2.5, 5.0), registry=REGISTRY)
