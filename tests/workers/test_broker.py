"""The broker channel on a real Redis: step messages cost no unacked bookkeeping and no ack,
tool messages keep both (they are redelivered if their worker dies)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kortex.turns.handoff import Handoff, StepDispatch, ToolDispatch
from tests.conftest import make_settings
from tests.integration.conftest import REDIS_URL
from workers.app import make_celery
from workers.dispatch import dispatch


def test_step_messages_are_taken_without_acks_and_tool_messages_with_them(tmp_path: Path) -> None:
    prefix = f"kxbroker-{uuid.uuid4().hex[:8]}"
    app = make_celery(make_settings(tmp_path, "sqlite:///unused.db", redis_url=REDIS_URL, redis_prefix=prefix))
    dispatch(app, Handoff(steps=(StepDispatch(tenant_id="t", turn_id="u", step=0),),
                          tools=(ToolDispatch(tenant_id="t", invocation_id="i", tool="get_logs", soft_limit=5,
                                              hard_limit=10),)))
    app.amqp.queues.select(["turns", "tools"])
    received: dict[str, Any] = {}
    try:
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
            assert acks == [received["tools"].delivery_tag]  # the step's ack never reached Redis
            assert channel.client.hlen(channel.unacked_key) == 0
    finally:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
