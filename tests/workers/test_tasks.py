"""The Celery shell: explicit names, queues, routing, and hand-offs with per-call time limits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kortex.turns.handoff import Handoff, ItemDispatch, StepDispatch, ToolDispatch
from workers.app import app
from workers.dispatch import dispatch
from workers.queues import Queue, TaskName


def test_tasks_have_explicit_names_and_queues() -> None:
    import workers.tasks  # noqa: F401 - registers the tasks

    for name in TaskName:
        assert name.value in app.tasks
    assert app.tasks[TaskName.STEP.value].queue == Queue.TURNS.value
    assert app.tasks[TaskName.TOOL.value].queue == Queue.TOOLS.value
    assert app.tasks[TaskName.POSTMORTEM_ITEM.value].queue == Queue.BATCH.value
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    assert {q.name for q in app.conf.task_queues} == {"turns", "tools", "batch"}


class FakeApp:
    conf = SimpleNamespace(broker_url="memory://")

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(self, name: str, **options: Any) -> None:
        self.sent.append((name, options))


def test_dispatch_sends_tools_with_their_time_limits_and_steps_to_turns() -> None:
    fake = FakeApp()
    dispatch(fake, Handoff(steps=(StepDispatch("t", "u", 2),),  # type: ignore[arg-type]
                           tools=(ToolDispatch("t", "i1", "get_logs", 40.0, 50.0),)))
    (tool_name, tool_opts), (step_name, step_opts) = fake.sent
    assert tool_name == "kortex.tool.run" and tool_opts["queue"] == "tools"
    assert tool_opts["soft_time_limit"] == 40.0 and tool_opts["time_limit"] == 50.0
    assert tool_opts["kwargs"] == {"tenant_id": "t", "invocation_id": "i1", "tool": "get_logs", "hard_limit": 50.0}
    step_kwargs = {"tenant_id": "t", "turn_id": "u", "step": 2}
    assert step_name == "kortex.turn.step" and step_opts == {
        "kwargs": step_kwargs, "queue": "turns", "headers": None, "priority": None,
        # What Flower shows, written without Celery's saferepr; declared as Celery would off Redis.
        "argsrepr": "()", "kwargsrepr": repr(step_kwargs), "declare": None}
    assert tool_opts["headers"] is None  # tracing off: no header at all


def test_batch_work_goes_to_the_batch_queue_with_ids_only() -> None:
    """A post-mortem item, and its turn's steps and tools, never wait in the chat queues."""
    fake = FakeApp()
    dispatch(fake, Handoff(steps=(StepDispatch("t", "u", 0, lane="batch"),),  # type: ignore[arg-type]
                           tools=(ToolDispatch("t", "i1", "get_logs", 40.0, 50.0, lane="batch"),),
                           items=(ItemDispatch("t", "item-1"),)))
    assert [(name, opts["queue"]) for name, opts in fake.sent] == [
        ("kortex.tool.run", "batch"), ("kortex.turn.step", "batch"), ("kortex.postmortem.item", "batch")]
    assert fake.sent[-1][1]["kwargs"] == {"tenant_id": "t", "item_id": "item-1"}


def test_a_traced_hand_off_carries_its_trace_context_in_the_message_headers() -> None:
    fake = FakeApp()
    parent = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
    dispatch(fake, Handoff(steps=(StepDispatch("t", "u", 1, trace=parent),),  # type: ignore[arg-type]
                           tools=(ToolDispatch("t", "i1", "get_logs", 40.0, 50.0, trace=parent),)))
    assert [opts["headers"] for _, opts in fake.sent] == [dict(parent), dict(parent)]


def test_a_worker_raises_the_broker_channel_pool_to_its_concurrency() -> None:
    """kombu's per-channel pool serves every pool thread's ack: it must not run dry."""
    from types import SimpleNamespace

    from workers import app as app_module

    conf = SimpleNamespace(broker_transport_options={"max_connections": 32})
    app_module._size_broker_pool(SimpleNamespace(concurrency=200, app=SimpleNamespace(conf=conf)))
    assert conf.broker_transport_options["max_connections"] == 208
    app_module._size_broker_pool(SimpleNamespace(concurrency=4, app=SimpleNamespace(conf=conf)))
    assert conf.broker_transport_options["max_connections"] == 208  # never lowered


def test_on_redis_a_direct_queue_is_not_declared_on_every_send_and_any_other_is(tmp_path: Any) -> None:
    """A direct queue's message is an LPUSH onto its list (the anonymous exchange); one routed
    by bindings (a topic exchange) still has Celery declare its queue first."""
    from kombu import Exchange
    from kombu import Queue as KombuQueue

    from tests.conftest import make_settings
    from workers.app import make_celery
    from workers.dispatch import _declare

    app = make_celery(make_settings(tmp_path, "sqlite:///unused.db", redis_url="redis://127.0.0.1:1/0"))
    app.amqp.queues.add(KombuQueue("by-topic", Exchange("topics", type="topic"), routing_key="a.#"))
    first, second = _declare(app, "turns"), _declare(app, "tools")
    assert first == [] and second == [] and first is not second  # kombu may add to it: never shared
    assert _declare(app, "batch") == []
    assert _declare(app, "by-topic") is None
    memory = make_celery(make_settings(tmp_path, "sqlite:///unused.db"))
    assert _declare(memory, "turns") is None  # the embedded mode: Celery's default
