"""A month of past incidents across products, each with the telemetry around it: the work a
batch of post-mortems has in the demo (``kortex seed --scenario incident-archive`` then
``kortex postmortem run --since 30d``). Every incident is closed; causes vary (a deploy, a
logged change, a dependency, a resource running out), so the documents differ. Checkout's
deploy regression is live on top of it, so chat questions work on the same data."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from kortex.telemetry.scenarios import checkout
from kortex.telemetry.scenarios.batch import TelemetryBatch, every, hex_id
from kortex.telemetry.scenarios.common import healthy_service


@dataclass(frozen=True, slots=True)
class Past:
    ref: str
    product: str
    title: str
    severity: str
    days_ago: float
    minutes: int                 # how long it lasted
    metric: str                  # what moved
    before: float
    after: float
    unit: str
    line: str                    # the dominant error line
    deploy: str | None = None    # a version that landed two minutes before the onset
    change: str | None = None    # a change the logs record just before the onset
    findings: str = ""
    resolution: str = ""


PAST = (
    Past("INC-1101", "checkout", "checkout p99 up after v2.11.0", "error", 29.2, 48, "http_request_duration_seconds_p99",
         0.21, 1.7, "seconds", "connection pool exhausted: timed out after 5000ms waiting for a connection to orders-db",
         deploy="v2.11.0", findings="v2.11.0 lowered the orders-db pool to 10.",
         resolution="Rolled back to v2.10.4; restored the pool size."),
    Past("INC-1104", "payments", "payments 5xx from the card processor", "critical", 27.5, 35, "http_requests_error_ratio",
         0.002, 0.18, "ratio", "upstream cardproc returned 503 Service Unavailable",
         findings="The card processor had an outage.", resolution="Failed over to the secondary processor."),
    Past("INC-1107", "search", "search slow while the index rebuilt", "warn", 25.1, 70, "http_request_duration_seconds_p99",
         0.09, 0.8, "seconds", "query timeout after 2000ms on shard 3",
         change="config change: search.index.rebuild=true applied by ops", resolution="Paused the rebuild."),
    Past("INC-1110", "ledger", "ledger writes failing: disk full on ledger-db-2", "critical", 22.8, 25,
         "http_requests_error_ratio", 0.001, 0.35, "ratio", "could not write WAL: No space left on device",
         findings="ledger-db-2 ran out of disk.", resolution="Grew the volume and pruned old WAL segments."),
    Past("INC-1113", "auth", "auth logins failing after certificate expiry", "critical", 20.3, 40,
         "http_requests_error_ratio", 0.001, 0.6, "ratio", "TLS handshake failed: certificate has expired",
         resolution="Renewed the certificate; added expiry monitoring."),
    Past("INC-1116", "checkout", "checkout errors after feature flag new_pricing", "error", 17.6, 30,
         "http_requests_error_ratio", 0.002, 0.09, "ratio", "pricing service returned 500: unknown currency",
         change="feature flag new_pricing enabled for 100% of traffic", resolution="Turned new_pricing off."),
    Past("INC-1119", "reporting", "reporting OOMKilled during month-end export", "error", 15.0, 55,
         "http_request_duration_seconds_p99", 0.4, 3.2, "seconds", "worker killed: out of memory (OOMKilled)",
         deploy="v4.2.0", findings="v4.2.0 loads whole reports in memory.", resolution="Rolled back to v4.1.9."),
    Past("INC-1122", "payments", "payments latency from a slow query after migration 0142", "error", 12.4, 45,
         "http_request_duration_seconds_p99", 0.15, 1.1, "seconds", "slow query took 2400ms: SELECT * FROM refunds",
         change="migration 0142_refunds_index applied", resolution="Added the missing index."),
    Past("INC-1125", "search", "search rate-limited by the geo API", "warn", 9.9, 20, "http_requests_error_ratio",
         0.002, 0.07, "ratio", "upstream geoapi returned 429 Too Many Requests: rate limit exceeded",
         resolution="Raised the quota with the geo API provider."),
    Past("INC-1128", "ledger", "ledger deadlocks after v7.3.0", "error", 7.2, 30, "http_requests_error_ratio",
         0.001, 0.05, "ratio", "deadlock detected while updating balances", deploy="v7.3.0",
         resolution="Rolled back to v7.2.8; fixed the lock order."),
    Past("INC-1131", "auth", "auth slow: session cache stampede", "warn", 4.6, 15, "http_request_duration_seconds_p99",
         0.05, 0.9, "seconds", "cache miss storm: 4000 concurrent recomputes of session keys",
         change="cache flush requested by deploy tooling", resolution="Enabled request coalescing."),
    Past("INC-1134", "checkout", "checkout timeouts calling inventory", "error", 2.3, 25,
         "http_request_duration_seconds_p99", 0.21, 2.4, "seconds", "request to inventory timed out after 3000ms",
         findings="inventory was saturated by a reconcile job.", resolution="Throttled the reconcile job."),
)


def build(now: datetime, rng: random.Random) -> TelemetryBatch:
    batch = checkout.build(now, rng)  # checkout, payments and search, today
    for past in PAST:
        _incident(batch, rng, past, now)
    for product in sorted({p.product for p in PAST} - {"checkout", "payments", "search"}):
        healthy_service(batch, rng, product, now, 0.12, [f"{product}-1", f"{product}-2"], "v1.0.0")
    return batch


def _incident(batch: TelemetryBatch, rng: random.Random, past: Past, now: datetime) -> None:
    onset = (now - timedelta(days=past.days_ago)).replace(second=0, microsecond=0)
    opened = onset + timedelta(minutes=6)
    closed = opened + timedelta(minutes=past.minutes)
    hosts = [f"{past.product}-{n}" for n in (1, 2, 3)]
    spread = {"seconds": 0.08, "ratio": 0.25}[past.unit]
    for ts in every(onset - timedelta(hours=2), closed + timedelta(hours=1), timedelta(minutes=1)):
        mean = past.after if onset <= ts < closed else past.before
        batch.metric(past.product, past.metric, ts, max(0.0, rng.gauss(mean, mean * spread)), past.unit)
    for ts in every(onset, closed, timedelta(seconds=20)):
        batch.log(past.product, ts, "error", past.line, host=rng.choice(hosts))
    if past.deploy is not None:
        batch.deploy(past.product, onset - timedelta(minutes=2), past.deploy, commit=hex_id(rng, 28), host=past.product)
    if past.change is not None:
        batch.log(past.product, onset - timedelta(minutes=1), "info", past.change, host=hosts[0])
    batch.incident(past.ref, past.title, opened, product=past.product, severity=past.severity, closed_at=closed,
                   findings=past.findings, resolution=past.resolution)
