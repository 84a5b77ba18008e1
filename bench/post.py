"""POST /v1/sessions/{id}/messages: latency and SQL statements per request.

    .venv/bin/python bench/post.py [--posts 300]

The real API app in-process (Starlette's TestClient), on a throwaway PostgreSQL database and
Redis under a private prefix, with the real Celery dispatch (the messages stay queued: no
worker runs). Each post goes to a fresh session of one tenant, with the same API key (so the
key lookup is cached after the first request, as for any steady client). Counts every SQL
statement the request runs (a SQLAlchemy cursor hook) and reports the median, and latency
p50/p99 measured in the client. Leaves nothing behind.

Runs against any checkout (``PYTHONPATH=<other checkout> bench/post.py``) so a change can be
measured beside the code before it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT))

PG_ADMIN = os.environ.get("KORTEX_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("KORTEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    from kortex.testing.scratch import throwaway_database as scratch_database

    with scratch_database(PG_ADMIN, prefix="kortex_bench") as (url, _name):
        yield url


def run(args: Any) -> dict[str, Any]:
    import redis

    prefix = f"kxbench-post-{uuid.uuid4().hex[:8]}"
    with throwaway_database() as pg_url:
        os.environ.update({
            "KORTEX_DATABASE_URL": pg_url, "KORTEX_REDIS_URL": REDIS_URL, "KORTEX_REDIS_PREFIX": prefix,
            "KORTEX_LLM__BUDGET__MAX_CONCURRENT_TURNS_PER_TENANT": "1000000",
            "KORTEX_LLM__BUDGET__TURNS_PER_MINUTE": "1000000",
        })
        from kortex.config import BudgetSettings

        if "sessions_per_minute" in BudgetSettings.model_fields:  # absent from older checkouts
            os.environ["KORTEX_LLM__BUDGET__SESSIONS_PER_MINUTE"] = "1000000"
        from fastapi.testclient import TestClient
        from sqlalchemy import event

        from api.main import create_app
        from kortex.config import load_settings
        from kortex.container import Kortex
        from kortex.storage import tenants
        from kortex.storage.migrate import upgrade
        from kortex.turns import chat

        upgrade(pg_url)
        settings = load_settings()
        setup = Kortex.create(settings)
        with setup.db.begin() as conn:
            tenant = tenants.create_tenant(conn, "bench")
            key = tenants.issue_api_key(conn, tenant.id).key
        sessions = [chat.create_session(setup, tenant.id, f"s{n}").id
                    for n in range(args.posts + 20)]
        setup.close()
        statements: list[int] = []
        latencies: list[float] = []
        try:
            app = create_app(settings)
            with TestClient(app) as client:
                counter = [0]

                def count(*_: Any) -> None:
                    counter[0] += 1

                event.listen(app.state.kortex.db.engine, "before_cursor_execute", count)
                headers = {"Authorization": f"Bearer {key}"}
                for n, sid in enumerate(sessions):
                    counter[0] = 0
                    started = time.perf_counter()
                    response = client.post(f"/v1/sessions/{sid}/messages", json={"content": "why is checkout slow?"},
                                           headers=headers)
                    elapsed = time.perf_counter() - started
                    assert response.status_code == 202, response.text
                    if n >= 20:  # after warm-up: pools filled, key cached, statements compiled
                        statements.append(counter[0])
                        latencies.append(elapsed)
        finally:
            client_redis = redis.Redis.from_url(REDIS_URL)
            keys = list(client_redis.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                client_redis.delete(*keys)
            client_redis.close()
    latencies.sort()
    return {
        "posts": len(latencies),
        "statements_median": statistics.median(statements),
        "statements_max": max(statements),
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--posts", type=int, default=300)
    args = parser.parse_args()
    r = run(args)
    print(f"POST /messages x{r['posts']}: {r['statements_median']} SQL statements (max {r['statements_max']}), "
          f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms")


if __name__ == "__main__":
    main()
