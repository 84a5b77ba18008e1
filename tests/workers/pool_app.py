"""A Celery app for tests/workers/test_pool.py: Redis broker, late acks and a window of one
message per slot, as the tools worker runs; each task stamps when it started."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from workers import pool

pool.install()

REDIS_URL = os.environ["POOL_TEST_REDIS_URL"]
PREFIX = os.environ["POOL_TEST_PREFIX"]

app = Celery("pooltest", broker=REDIS_URL)
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, task_ignore_result=True,
                broker_transport_options={"global_keyprefix": f"{PREFIX}:celery:"})
_redis = redis.Redis.from_url(REDIS_URL)


@app.task(name="pooltest.stamp")
def stamp(i: int) -> None:
    _redis.rpush(f"{PREFIX}:stamps", f"{i} {time.time()}")
