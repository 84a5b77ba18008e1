"""The broker channel on a real Redis: step messages cost no unacked bookkeeping and no ack,
tool messages keep both (they are redelivered if their worker dies); sending declares nothing."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kortex.turns.handoff import Handoff, StepDispatch, ToolDispatch
from tests.conftest import make_settings
from tests.integration.conftest import REDIS_URL
from workers.app import make_celery
from workers.dispatch import BUSY_PRIORITY, dispatch


def test_step_messages_are_taken_without_acks_and_tool_messages_with_them(tmp_path: Path) -> None:
    prefix = f"kxbroker-{uuid.uuid4().hex[:8]}"
    app = make_celery(make_settings(tmp_path, "sqlite:///unused.db", redis_url=REDIS_URL, redis_prefix=prefix))
    dispatch(app, Handoff(steps=(StepDispatch(tenant_id="t", turn_id="u", step=0),),
                          tools=(ToolDispatch(tenant_id="t", invocation_id="i", tool="get_logs", soft_limit=5,
                                              hard_limit=10),)))
    app.amqp.queues.select(["turns", "tools"])
    received: dict[str, Any] = {}
    try:
        import redis

        # Sent before any worker declared a queue, with no declaration of their own (no binding
        # written: workers/dispatch.py), they wait on the queues' lists all the same.
        client = redis.Redis.from_url(REDIS_URL)
        assert not list(client.scan_iter(f"{prefix}:*binding*"))
        assert {k.decode() for k in client.scan_iter(f"{prefix}:*")} == {f"{prefix}:celery:turns", f"{prefix}:celery:tools"}
        with app.connection_for_read() as conn:
            consumer = app.amqp.TaskConsumer(conn, callbacks=[
                lambda body, message: received.setdefault(message.delivery_info["routing_key"], message)])
            channel = consumer.channel
            acks: list[Any] = []
            real_ack = channel.qos.ack
            channel.qos.ack = lambda tag: (acks.append(tag), real_ack(tag))
            consumer.consume()
            while len(received) < 2:
                conn.drain_events(timeout=5)
            unacked = channel.client.hlen(channel.unacked_key)
            for message in received.values():
                message.ack()
            assert unacked == 1  # the tool message only
            # What Flower and the worker log show: the ids, as sent.
            assert received["turns"].headers["kwargsrepr"] == repr({"tenant_id": "t", "turn_id": "u", "step": 0})
            assert received["turns"].headers["argsrepr"] == "()"
            assert acks == [received["tools"].delivery_tag]  # the step's ack never reached Redis
            assert channel.client.hlen(channel.unacked_key) == 0
    finally:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)


def test_a_busy_tenants_step_is_taken_after_the_steps_queued_behind_it(tmp_path: Path) -> None:
    """StepDispatch.busy: the message goes out at a lower priority, so a worker takes every
    other tenant's step first, even one sent after it."""
    prefix = f"kxbroker-{uuid.uuid4().hex[:8]}"
    app = make_celery(make_settings(tmp_path, "sqlite:///unused.db", redis_url=REDIS_URL, redis_prefix=prefix))
    for turn, busy in [("flood-1", True), ("flood-2", True), ("calm", False)]:
        dispatch(app, Handoff(steps=(StepDispatch(tenant_id="t", turn_id=turn, step=0, busy=busy),)))
    app.amqp.queues.select(["turns"])
    order: list[tuple[str, Any]] = []
    try:
        with app.connection_for_read() as conn:
            consumer = app.amqp.TaskConsumer(conn, callbacks=[
                lambda body, message: order.append((body[1]["turn_id"], message.properties.get("priority")))])
            consumer.consume()
            while len(order) < 3:
                conn.drain_events(timeout=5)
        assert [turn for turn, _ in order] == ["calm", "flood-1", "flood-2"]
        # The task sees the priority (its request.delivery_info; workers/tasks.py keeps it on a step it hands back).
        assert [priority == BUSY_PRIORITY for _, priority in order] == [False, True, True]
    finally:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
