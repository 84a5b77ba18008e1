"""The bare baseline: a FastAPI endpoint that enqueues a bare Celery task, the task writing N
chunks and a ``done`` to a Redis Stream, and a bare SSE endpoint streaming that stream.

    celery -A bench.bare_app worker -Q bare          # the task (prefork, one process per CPU: the defaults)
    uvicorn bench.bare_app:api --port 8001           # POST /bare/turns, GET /bare/turns/{id}/events

Same broker, serializer, acknowledgement and prefetch settings as Kortex's own app, so the
difference measured is what Kortex adds: authentication, the database, the tool pipeline,
the extra hops (a tool task and a second step), the stream hub.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator

import redis
import redis.asyncio as aredis
from celery import Celery
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from kombu import Queue
from pydantic import BaseModel, Field

BROKER = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("BENCH_PREFIX", "kxbench")

app = Celery("bare", broker=BROKER)
app.conf.update(
    task_serializer="json", accept_content=["json"], result_backend=None, task_ignore_result=True,
    task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
    task_queues=[Queue("bare")], task_default_queue="bare", worker_hijack_root_logger=False,
    broker_transport_options={"global_keyprefix": f"{PREFIX}:celery:", "visibility_timeout": 3600},
)
_client: redis.Redis | None = None
_pid: int | None = None


def client() -> redis.Redis:
    global _client, _pid
    if _client is None or _pid != os.getpid():  # one client per prefork child, made after the fork
        _client = redis.Redis.from_url(BROKER, decode_responses=True)
        _pid = os.getpid()
    return _client


@app.task(name="bench.bare.write", ignore_result=True)
def write(*, key: str, chunks: int, counter: str | None = None) -> None:
    r = client()
    body = json.dumps({"type": "text", "step": 0, "delta": "x" * 40})
    for _ in range(chunks):
        r.xadd(key, {"t": "text", "d": body}, maxlen=20_000, approximate=True)
    r.xadd(key, {"t": "done", "d": json.dumps({"type": "done", "status": "done"})}, maxlen=20_000, approximate=True)
    r.expire(key, 600)
    if counter:
        r.incr(counter)


# ---- the bare HTTP side ---------------------------------------------------------------------------

api = FastAPI()
_areader = aredis.Redis.from_url(BROKER, decode_responses=True)


class Post(BaseModel):
    chunks: int = Field(1, ge=1, le=10_000)


def _key(turn_id: str) -> str:
    return f"{PREFIX}:bare:{turn_id}"


@api.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@api.post("/bare/turns", status_code=202)
def post_turn(body: Post) -> dict[str, str]:
    # A plain def, as a FastAPI route calling Celery's blocking client is usually written.
    turn_id = uuid.uuid4().hex
    write.apply_async(kwargs={"key": _key(turn_id), "chunks": body.chunks}, queue="bare")
    return {"turn_id": turn_id, "events_url": f"/bare/turns/{turn_id}/events"}


@api.get("/bare/turns/{turn_id}/events")
async def events(turn_id: str) -> StreamingResponse:
    async def stream() -> AsyncIterator[str]:
        last = "0-0"
        while True:
            reply = await _areader.xread({_key(turn_id): last}, count=500, block=15_000)
            if not reply:
                yield ": keepalive\n\n"
                continue
            for _key_name, entries in reply:
                for eid, fields in entries:
                    last = eid
                    yield f"id: {eid}\nevent: {fields['t']}\ndata: {fields['d']}\n\n"
                    if fields["t"] == "done":
                        return

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
