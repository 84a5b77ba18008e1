"""Deploy regression: checkout v2.14.0 ships with a ten-connection DB pool; p99 jumps and the
pool runs dry."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from kortex.telemetry.scenarios.batch import TelemetryBatch, every, hex_id
from kortex.telemetry.scenarios.common import fine_metrics, healthy_service, history, past_incidents

HOSTS = ["checkout-7d9f-1", "checkout-7d9f-2", "checkout-7d9f-3"]


def pool_trace(batch: TelemetryBatch, rng: random.Random, ts: datetime, service: str, route: str, db: str,
               wait_ms: int, pool: int) -> str:
    """A request that waited for a database connection until it gave up."""
    trace_id = hex_id(rng)
    root, acquire, load = hex_id(rng), hex_id(rng), hex_id(rng)
    error = f"timed out after {wait_ms}ms waiting for a connection to {db} (pool max_size={pool})"
    batch.span(trace_id, root, None, service, route, ts, wait_ms + rng.randint(150, 400), error="HTTP 503",
               tags={"http.status_code": 503, "http.route": route}, request_id=f"{service[:3]}-{hex_id(rng, 32)}")
    batch.span(trace_id, load, root, service, "cart: load", ts + timedelta(milliseconds=2), rng.randint(4, 15))
    batch.span(trace_id, acquire, root, service, f"{db}: acquire connection", ts + timedelta(milliseconds=20),
               wait_ms, error=error, tags={"db.system": "postgresql", "db.pool.max_size": pool})
    return trace_id


def build(now: datetime, rng: random.Random) -> TelemetryBatch:
    batch = TelemetryBatch()
    deploy_at = (now - timedelta(minutes=42)).replace(second=0, microsecond=0)
    onset = deploy_at + timedelta(minutes=2)
    batch.deploy("checkout", now - timedelta(hours=26), "v2.13.2", commit="41be07d", host="checkout",
                 duration_s=95)
    batch.deploy("checkout", deploy_at, "v2.14.0", commit="9f3c2ab", host="checkout", duration_s=88)
    batch.deploy("payments", now - timedelta(hours=2, minutes=10), "v5.2.1", commit="c0ffee1", host="payments",
                 duration_s=61)
    history(batch, rng, "checkout", now, {"http_request_duration_seconds_p99": (0.21, 0.018, "seconds"),
                                          "http_requests_error_ratio": (0.002, 0.0007, "ratio"),
                                          "db_pool_connections_in_use": (9, 2, "connections")})
    fine_metrics(batch, rng, "checkout", now, onset, {
        "http_request_duration_seconds_p99": (lambda bad: rng.gauss(1.9, 0.22) if bad else rng.gauss(0.21, 0.018),
                                              "seconds"),
        "http_requests_error_ratio": (lambda bad: rng.gauss(0.071, 0.01) if bad else rng.gauss(0.002, 0.0007),
                                      "ratio"),
        "db_pool_connections_in_use": (lambda bad: 10.0 if bad else float(min(40, max(2, round(rng.gauss(9, 2))))),
                                       "connections"),
    })
    for ts in every(now - timedelta(hours=3), now, timedelta(seconds=30)):
        bad = ts >= onset
        ms = int(rng.gauss(1850, 260) if bad else rng.gauss(175, 25))
        batch.log("checkout", ts, "info", f"POST /api/checkout 200 in {ms}ms", host=rng.choice(HOSTS))
    for host in HOSTS:
        batch.log("checkout", deploy_at + timedelta(seconds=20), "info",
                  "starting checkout v2.14.0 (commit 9f3c2ab); orders-db pool max_size=10", host=host)
    for ts in every(onset, now, timedelta(seconds=13)):
        at = ts + timedelta(milliseconds=rng.randint(0, 900))
        trace_id = pool_trace(batch, rng, at - timedelta(milliseconds=5200), "checkout", "POST /api/checkout",
                              "orders-db", 5000, 10)
        waiting = rng.randint(31, 64)
        batch.log("checkout", at, "error",
                  f"connection pool exhausted: timed out after 5000ms waiting for a connection to orders-db "
                  f"(pool max_size=10, {waiting} requests waiting)", host=rng.choice(HOSTS), trace_id=trace_id)
        if rng.random() < 0.4:
            batch.log("checkout", ts + timedelta(seconds=3), "warn",
                      f"slow request POST /api/checkout took {rng.randint(2100, 5200)}ms (db wait)",
                      host=rng.choice(HOSTS))
    batch.product("checkout", {
        "product": "checkout", "version": "v2.14.0", "health": "degraded",
        "started_at": (deploy_at + timedelta(seconds=20)).isoformat(),
        "build": {"commit": "9f3c2ab", "built_at": (deploy_at - timedelta(minutes=25)).isoformat()},
        "config_hash": "5e1d0c9a", "config": {"orders_db.pool.max_size": 10, "orders_db.pool.timeout_ms": 5000,
                                              "http.workers": 32},
        "feature_flags": {"new_cart_service": True},
    }, now - timedelta(seconds=20))
    batch.incident("INC-0981", "checkout latency spike: orders-db connection pool exhausted after a config change",
                   now - timedelta(days=41, hours=5), product="checkout", severity="error",
                   closed_at=now - timedelta(days=41, hours=4),
                   findings="p99 rose to 2.3 s and the logs filled with 'connection pool exhausted' after a config "
                            "refactor lowered orders_db.pool.max_size from 50 to 10.",
                   resolution="Restored orders_db.pool.max_size=50 and rolled back the config change; added an "
                              "alert on pool saturation.")
    past_incidents(batch, now)
    healthy_service(batch, rng, "payments", now, 0.15, ["payments-1", "payments-2"], "v5.2.1")
    healthy_service(batch, rng, "search", now, 0.09, ["search-1"], "v8.0.3")
    return batch
