"""Realistic incident scenarios for the embedded telemetry store (demo, tests, benchmarks).

Each scenario builds its telemetry relative to ``now`` so relative questions ("last hour")
always land on it, from a fixed random seed so every run is the same.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete
from sqlalchemy.engine import Connection

from kortex.errors import InvalidInput
from kortex.storage.schema import telemetry_deploys, telemetry_logs, telemetry_metrics
from kortex.telemetry.sources import LEVELS


@dataclass
class TelemetryBatch:
    logs: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    deploys: list[dict[str, Any]] = field(default_factory=list)

    def log(self, product: str, ts: datetime, level: str, message: str, host: str = "",
            trace_id: str | None = None) -> None:
        self.logs.append({"product": product, "ts": ts, "level": level, "severity": LEVELS[level],
                          "host": host, "message": message, "trace_id": trace_id, "attrs": None})

    def metric(self, product: str, name: str, ts: datetime, value: float, unit: str | None = None,
               labels: dict[str, str] | None = None) -> None:
        self.metrics.append({"product": product, "metric": name, "ts": ts, "value": value, "unit": unit,
                             "labels": labels or {}})

    def deploy(self, product: str, ts: datetime, version: str, *, actor: str = "ci", host: str = "",
               duration_s: float | None = None, status: str = "ok", commit: str | None = None,
               rolled_back: bool = False) -> None:
        self.deploys.append({"product": product, "ts": ts, "version": version, "actor": actor, "host": host,
                             "duration_s": duration_s, "status": status, "commit": commit,
                             "rolled_back": rolled_back})


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    question: str           # what an operator would ask
    root_cause: str         # what a good answer names
    build: Callable[[datetime, random.Random], TelemetryBatch]


def _minutes(start: datetime, end: datetime, every: timedelta) -> list[datetime]:
    out, ts = [], start
    while ts < end:
        out.append(ts)
        ts += every
    return out


def _healthy_service(batch: TelemetryBatch, rng: random.Random, product: str, now: datetime,
                     p99: float, hosts: list[str]) -> None:
    for ts in _minutes(now - timedelta(hours=6), now, timedelta(minutes=1)):
        batch.metric(product, "http_request_duration_seconds_p99", ts, max(0.01, rng.gauss(p99, p99 * 0.08)),
                     "seconds")
        batch.metric(product, "http_requests_error_ratio", ts, max(0.0, rng.gauss(0.002, 0.0008)), "ratio")
    for ts in _minutes(now - timedelta(hours=3), now, timedelta(seconds=45)):
        ms = int(max(5, rng.gauss(p99 * 400, p99 * 60)))
        batch.log(product, ts, "info", f"GET /api/{product} 200 in {ms}ms", host=rng.choice(hosts))


def build_checkout_deploy_regression(now: datetime, rng: random.Random) -> TelemetryBatch:
    """checkout v2.14.0 ships with a ten-connection DB pool; p99 jumps and the pool runs dry."""
    batch = TelemetryBatch()
    hosts = ["checkout-7d9f-1", "checkout-7d9f-2", "checkout-7d9f-3"]
    deploy_at = (now - timedelta(minutes=42)).replace(second=0, microsecond=0)
    onset = deploy_at + timedelta(minutes=2)
    batch.deploy("checkout", now - timedelta(hours=26), "v2.13.2", commit="41be07d", host="checkout",
                 duration_s=95)
    batch.deploy("checkout", deploy_at, "v2.14.0", commit="9f3c2ab", host="checkout", duration_s=88)
    batch.deploy("payments", now - timedelta(hours=2, minutes=10), "v5.2.1", commit="c0ffee1", host="payments",
                 duration_s=61)
    for ts in _minutes(now - timedelta(hours=6), now, timedelta(minutes=1)):
        bad = ts >= onset
        p99 = rng.gauss(1.9, 0.22) if bad else rng.gauss(0.21, 0.018)
        batch.metric("checkout", "http_request_duration_seconds_p99", ts, max(0.05, p99), "seconds")
        batch.metric("checkout", "http_requests_error_ratio", ts,
                     max(0.0, rng.gauss(0.071, 0.01) if bad else rng.gauss(0.002, 0.0007)), "ratio")
        batch.metric("checkout", "db_pool_connections_in_use", ts,
                     10.0 if bad else float(min(40, max(2, round(rng.gauss(9, 2))))), "connections")
    for ts in _minutes(now - timedelta(hours=3), now, timedelta(seconds=30)):
        bad = ts >= onset
        ms = int(rng.gauss(1850, 260) if bad else rng.gauss(175, 25))
        batch.log("checkout", ts, "info", f"POST /api/checkout 200 in {ms}ms", host=rng.choice(hosts))
    for host in hosts:
        batch.log("checkout", deploy_at + timedelta(seconds=20), "info",
                  "starting checkout v2.14.0 (commit 9f3c2ab); orders-db pool max_size=10", host=host)
    for ts in _minutes(onset, now, timedelta(seconds=13)):
        waiting = rng.randint(31, 64)
        batch.log("checkout", ts + timedelta(milliseconds=rng.randint(0, 900)), "error",
                  f"connection pool exhausted: timed out after 5000ms waiting for a connection to orders-db "
                  f"(pool max_size=10, {waiting} requests waiting)",
                  host=rng.choice(hosts), trace_id=f"{rng.getrandbits(64):016x}")
        if rng.random() < 0.4:
            batch.log("checkout", ts + timedelta(seconds=3), "warn",
                      f"slow request POST /api/checkout took {rng.randint(2100, 5200)}ms (db wait)",
                      host=rng.choice(hosts))
    _healthy_service(batch, rng, "payments", now, 0.15, ["payments-1", "payments-2"])
    _healthy_service(batch, rng, "search", now, 0.09, ["search-1"])
    return batch


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="checkout-deploy-regression",
            title="checkout slows down after deploy v2.14.0 exhausts its DB connection pool",
            question="Why is checkout slow?",
            root_cause="deploy v2.14.0 of checkout shrank the orders-db connection pool; the pool is exhausted",
            build=build_checkout_deploy_regression,
        ),
    )
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise InvalidInput(f"unknown scenario {name!r}; choose from {', '.join(sorted(SCENARIOS))}") from None


def seed(conn: Connection, tenant_id: str, scenario: Scenario, *, now: datetime,
               replace: bool = True, seed_value: int = 7) -> dict[str, int]:
    """Write ``scenario``'s telemetry for ``tenant_id``; ``replace`` clears the tenant's old data."""
    batch = scenario.build(now, random.Random(seed_value))
    if replace:
        for table in (telemetry_logs, telemetry_metrics, telemetry_deploys):
            conn.execute(delete(table).where(table.c.tenant_id == tenant_id))
    for table, rows in ((telemetry_logs, batch.logs), (telemetry_metrics, batch.metrics),
                        (telemetry_deploys, batch.deploys)):
        for i in range(0, len(rows), 2000):
            conn.execute(table.insert(), [{**r, "tenant_id": tenant_id} for r in rows[i:i + 2000]])
    return {"logs": len(batch.logs), "metrics": len(batch.metrics), "deploys": len(batch.deploys)}
