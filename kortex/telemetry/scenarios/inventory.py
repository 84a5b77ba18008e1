"""Connection-pool exhaustion without a deploy: a stock-reconcile batch job starts at peak time and
holds most of inventory-db's pool in long transactions; every API request then waits for a
connection. The same thing happened two months ago (INC-0877)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from kortex.telemetry.scenarios.batch import TelemetryBatch, every
from kortex.telemetry.scenarios.checkout import pool_trace
from kortex.telemetry.scenarios.common import fine_metrics, healthy_service, history, past_incidents

HOSTS = ["inventory-1", "inventory-2", "inventory-3", "inventory-4"]


def build(now: datetime, rng: random.Random) -> TelemetryBatch:
    batch = TelemetryBatch()
    job_at = (now - timedelta(minutes=36)).replace(second=0, microsecond=0)
    onset = job_at + timedelta(minutes=1)
    batch.deploy("inventory", now - timedelta(days=3, hours=2), "v3.8.1", commit="a71c3d0", host="inventory",
                 duration_s=120)
    # A deploy elsewhere shortly before: correlation by time alone would blame it.
    batch.deploy("catalog", now - timedelta(minutes=49), "v1.12.0", commit="d4e5f60", host="catalog",
                 duration_s=70)
    history(batch, rng, "inventory", now, {"http_request_duration_seconds_p99": (0.12, 0.01, "seconds"),
                                           "http_requests_error_ratio": (0.001, 0.0004, "ratio"),
                                           "db_pool_connections_in_use": (18, 3, "connections")})
    fine_metrics(batch, rng, "inventory", now, onset, {
        "http_request_duration_seconds_p99": (lambda bad: rng.gauss(3.1, 0.3) if bad else rng.gauss(0.12, 0.01),
                                              "seconds"),
        "http_requests_error_ratio": (lambda bad: rng.gauss(0.09, 0.012) if bad else rng.gauss(0.001, 0.0004),
                                      "ratio"),
        "db_pool_connections_in_use": (lambda bad: 50.0 if bad else float(max(4, round(rng.gauss(18, 3)))),
                                       "connections"),
    })
    for ts in every(now - timedelta(hours=3), now, timedelta(seconds=30)):
        bad = ts >= onset
        ms = int(rng.gauss(2900, 300) if bad else rng.gauss(95, 12))
        batch.log("inventory", ts, "info", f"GET /api/inventory/stock 200 in {ms}ms", host=rng.choice(HOSTS))
    batch.log("inventory", job_at, "info", "job stock-reconcile started: full reconciliation, 240 batches",
              host="inventory-jobs-1")
    for ts in every(onset, now, timedelta(seconds=11)):
        at = ts + timedelta(milliseconds=rng.randint(0, 900))
        trace_id = pool_trace(batch, rng, at - timedelta(milliseconds=3200), "inventory",
                              "GET /api/inventory/stock", "inventory-db", 3000, 50)
        batch.log("inventory", at, "error",
                  f"connection pool exhausted: 50/50 connections in use to inventory-db, {rng.randint(41, 46)} held "
                  "by job stock-reconcile; timed out after 3000ms waiting for a connection",
                  host=rng.choice(HOSTS), trace_id=trace_id)
    for ts in every(onset, now, timedelta(minutes=2)):
        batch.log("inventory", ts, "warn", f"job stock-reconcile: transaction open for {rng.randint(90, 400)}s on "
                  f"inventory-db (batch {rng.randint(3, 40)} of 240)", host="inventory-jobs-1")
    batch.product("inventory", {
        "product": "inventory", "version": "v3.8.1", "health": "degraded",
        "started_at": (now - timedelta(days=3, hours=2)).isoformat(),
        "build": {"commit": "a71c3d0", "built_at": (now - timedelta(days=3, hours=3)).isoformat()},
        "config_hash": "0b9e77f1", "config": {"inventory_db.pool.max_size": 50, "jobs.stock_reconcile.schedule":
                                              "manual", "http.workers": 24},
        "feature_flags": {},
    }, now - timedelta(seconds=25))
    batch.incident("INC-0877", "inventory timeouts: stock-reconcile job held the connection pool",
                   now - timedelta(days=63, hours=3), product="inventory", severity="error",
                   closed_at=now - timedelta(days=63, hours=1),
                   findings="A full stock reconciliation ran at peak time and held most of inventory-db's "
                            "connection pool in long transactions; API requests timed out waiting for connections.",
                   resolution="Stopped the job, then moved stock-reconcile to the read replica and capped its share "
                              "of the pool at 5 connections; run it off-peak only.")
    past_incidents(batch, now)
    healthy_service(batch, rng, "catalog", now, 0.08, ["catalog-1", "catalog-2"], "v1.12.0")
    return batch
