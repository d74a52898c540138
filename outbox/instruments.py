"""The relay's Prometheus metrics, in the daemons' registry (shardq.core.instruments)
that `shardq outbox-relay --metrics-port` serves."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from shardq.core.instruments import REGISTRY

RELAY_ROWS = Counter("shardq_relay_rows",
                     "Outbox rows a relay settled: delivered, duplicate (collapsed by the "
                     "target), retried, failed_<reason>", ["source", "outcome"],
                     registry=REGISTRY)
RELAY_DELIVERY_SECONDS = Histogram(
    "shardq_relay_delivery_latency_seconds",
    "From an outbox row's commit (or re-queue) to the claim of the round that delivered it",
    ["source"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0,
             3600.0), registry=REGISTRY)
RELAY_ROUND_SECONDS = Histogram("shardq_relay_round_seconds",
                                "One relay round: claim, deliver, settle", ["source"],
                                buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                         0.5, 1.0, 2.5, 5.0), registry=REGISTRY)
