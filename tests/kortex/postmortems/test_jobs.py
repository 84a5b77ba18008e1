"""Post-mortem jobs, end to end in-process (the Celery shell is tested in tests/integration):
each item is a turn of the post-mortem profile, its document validated and stored once, the
job advanced by the turns' end hooks, stopped by its budget or a cancel, and invisible to other
tenants. The same tests run on PostgreSQL in tests/integration/test_postmortems_pg.py (the
fixture ``h`` is replaced there)."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import update

from kortex.errors import Conflict, NotFound
from kortex.postmortems import jobs
from kortex.postmortems.document import PostMortem
from kortex.storage import invocations
from kortex.storage import turns as turn_store
from kortex.storage.schema import turns as turns_table
from kortex.testing.inline import drive
from kortex.turns.chat import get_turn
from kortex.turns.handoff import Handoff
from tests.conftest import Harness


@pytest.fixture
def h(harness: Harness) -> Harness:
    return harness


@pytest.fixture
def tenant(h: Harness) -> str:
    tenant = h.tenant(f"pm-{uuid.uuid4().hex[:8]}")
    h.seed(tenant, "incident-archive")
    return tenant


ALL = jobs.JobRequest(filter=jobs.JobFilter(since="30d"), concurrency=3)


def test_a_job_writes_one_valid_cited_post_mortem_per_incident(h: Harness, tenant: str) -> None:
    submitted = jobs.submit(h.k, tenant, ALL, by="test")
    total = sum(submitted.view.counts.values())
    assert total >= 12 and submitted.view.counts["queued"] == total - 3 and submitted.view.counts["dispatched"] == 3
    assert len(submitted.handoff.items) == 3  # the job's concurrency, no more

    drive(h.k, submitted.handoff)

    view = jobs.view(h.k, tenant, submitted.view.job.id)
    assert view.job.status == "done" and view.counts["done"] == total, view.counts
    items = jobs.list_items(h.k, tenant, view.job.id, limit=1000)
    assert [i.position for i in items] == list(range(total))
    for item in items:
        stored = jobs.postmortem_of(h.k, tenant, item.incident_ref)
        document = PostMortem.model_validate(stored.document)  # what was stored is a valid document
        assert document.incident_id == item.incident_ref and stored.item_id == item.id
        with h.k.db.connect() as conn:
            succeeded = invocations.succeeded_calls(conn, tenant, item.turn_id)
        assert document.cited() and set(document.cited()) <= succeeded, "every citation names a call that answered"
        assert stored.grounding == {"cited": len(document.cited()), "dangling": []}
        assert get_turn(h.k, tenant, item.turn_id).profile == "postmortem"
    # The deploy regression in the archive is named as the cause of its incident.
    inc = jobs.postmortem_of(h.k, tenant, "INC-1101").document
    assert "v2.11.0" in inc["root_cause"]["statement"] and inc["severity"] == "error"
    assert "# Post-mortem: checkout p99 up after v2.11.0" in PostMortem.model_validate(inc).markdown()


def test_running_twice_never_writes_two_and_a_rerun_skips_what_is_done(h: Harness, tenant: str) -> None:
    request = jobs.JobRequest(incident_ids=["INC-1110", "INC-1101"], concurrency=2)
    first = jobs.submit(h.k, tenant, request, by="test")
    # The item's task delivered twice: the second delivery finds the item started.
    again = [jobs.start_item(h.k, tenant, i.item_id) for i in first.handoff.items]
    assert all(len(a.steps) == 1 for a in again)
    assert [jobs.start_item(h.k, tenant, i.item_id) for i in first.handoff.items] == [Handoff(), Handoff()]
    for handoff in again:
        drive(h.k, handoff)
    items = jobs.list_items(h.k, tenant, first.view.job.id)
    assert [i.incident_ref for i in items] == ["INC-1110", "INC-1101"]  # the order asked for
    assert [i.status for i in items] == ["done", "done"]
    # The end hook heard twice (a re-delivered step finds the turn over): still one document.
    with h.k.db.begin() as conn:
        turn = turn_store.get_turn(conn, tenant, items[0].turn_id)
        assert jobs.on_end(h.k, conn, turn, jobs.TurnEnd(status="done")) == Handoff()
    assert len(jobs.postmortems_of(h.k, tenant, first.view.job.id)) == 2

    rerun = jobs.submit(h.k, tenant, request, by="test")
    assert rerun.view.counts["skipped"] == 2 and rerun.view.job.status == "done" and not rerun.handoff
    assert {i.error["code"] for i in jobs.list_items(h.k, tenant, rerun.view.job.id)} == {"exists"}
    forced = jobs.submit(h.k, tenant, request.model_copy(update={"force": True}), by="test")
    drive(h.k, forced.handoff)
    assert jobs.view(h.k, tenant, forced.view.job.id).counts["done"] == 2


def test_the_same_idempotency_key_answers_the_same_job(h: Harness, tenant: str) -> None:
    request = jobs.JobRequest(incident_ids=["INC-1101"])
    first = jobs.submit(h.k, tenant, request, idempotency_key="k1", by="test")
    second = jobs.submit(h.k, tenant, request, idempotency_key="k1", by="test")
    assert second.view.job.id == first.view.job.id and not second.created and not second.handoff
    with pytest.raises(Exception) as raised:
        jobs.submit(h.k, tenant, request.model_copy(update={"concurrency": 2}), idempotency_key="k1", by="test")
    assert getattr(raised.value, "code", "") == "idempotency_mismatch"


def test_max_usd_stops_the_job_before_the_next_llm_call(h: Harness, tenant: str) -> None:
    submitted = jobs.submit(h.k, tenant, jobs.JobRequest(filter=jobs.JobFilter(since="30d"), concurrency=1,
                                                         max_usd=0.01), by="test")
    [item] = submitted.handoff.items
    step0 = jobs.start_item(h.k, tenant, item.item_id)
    turn_id = step0.steps[0].turn_id
    with h.k.db.begin() as conn:  # as if the item's earlier calls had spent more than the job may
        conn.execute(update(turns_table).where(turns_table.c.id == turn_id).values(cost_usd=0.02))
    drive(h.k, step0)
    turn = get_turn(h.k, tenant, turn_id)
    assert turn.status == "failed" and turn.error["code"] == "budget"
    view = jobs.view(h.k, tenant, submitted.view.job.id)
    total = sum(view.counts.values())
    assert view.job.status == "done" and view.counts["skipped"] == total and view.spend_usd == pytest.approx(0.02)
    assert {i.error["code"] for i in jobs.list_items(h.k, tenant, view.job.id, limit=1000)} == {"budget"}


def test_cancel_stops_queued_items_and_cancels_running_ones_when_asked(h: Harness, tenant: str) -> None:
    submitted = jobs.submit(h.k, tenant, ALL.model_copy(update={"concurrency": 2}), by="test")
    first, second = submitted.handoff.items
    started = jobs.start_item(h.k, tenant, first.item_id)  # running; the second is dispatched, not started
    report, handoff = jobs.cancel(h.k, tenant, submitted.view.job.id, running="cancel", by="key:test")
    assert report.running == 1 and report.cancelled_queued == sum(report.view.counts.values()) - 1
    assert not handoff  # a cancelled job starts nothing more
    assert get_turn(h.k, tenant, started.steps[0].turn_id).status == "cancelled"
    assert jobs.start_item(h.k, tenant, second.item_id) == Handoff()  # its late task does nothing
    view = jobs.view(h.k, tenant, submitted.view.job.id)
    assert view.job.status == "cancelled" and view.counts["cancelled"] == sum(view.counts.values())
    again, _ = jobs.cancel(h.k, tenant, submitted.view.job.id, by="key:test")  # idempotent
    assert again.cancelled_queued == 0 and again.view.job.status == "cancelled"


def test_cancel_with_finish_lets_the_running_item_finish(h: Harness, tenant: str) -> None:
    submitted = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101", "INC-1110", "INC-1116"],
                                                         concurrency=1), by="test")
    [first] = submitted.handoff.items
    started = jobs.start_item(h.k, tenant, first.item_id)
    report, _ = jobs.cancel(h.k, tenant, submitted.view.job.id, running="finish", by="key:test")
    assert report.running == 1 and report.cancelled_queued == 2
    drive(h.k, started)  # the running item goes on to its end
    items = jobs.list_items(h.k, tenant, submitted.view.job.id)
    assert [i.status for i in items] == ["done", "cancelled", "cancelled"]
    assert jobs.postmortem_of(h.k, tenant, "INC-1101").item_id == items[0].id
    feed = jobs.progress(h.k, tenant, submitted.view.job.id, after=0)
    assert [e.kind for e in feed.events] == ["item_started", "item_cancelled", "item_cancelled", "job_cancelled",
                                             "item_done"]
    assert [e.seq for e in feed.events] == [1, 2, 3, 4, 5] and feed.over
    rest = jobs.progress(h.k, tenant, submitted.view.job.id, after=2)  # resumed mid-way: exactly the rest
    assert [e.kind for e in rest.events] == ["item_cancelled", "job_cancelled", "item_done"]


def test_a_job_cancelled_with_finish_still_owns_its_running_incident(h: Harness, tenant: str) -> None:
    """The item a cancel let finish is still being written (and billed): a new job for its
    incident skips it as in progress rather than writing a second post-mortem beside it."""
    first = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101"]), by="test")
    started = jobs.start_item(h.k, tenant, first.handoff.items[0].item_id)
    jobs.cancel(h.k, tenant, first.view.job.id, running="finish", by="key:test")

    second = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101"]), by="test")
    assert not second.handoff and second.view.job.status == "done"
    [item] = jobs.list_items(h.k, tenant, second.view.job.id)
    assert item.status == "skipped" and item.error["code"] == "in_progress", item.error
    drive(h.k, started)
    assert [p.item_id for p in jobs.postmortems_of(h.k, tenant, first.view.job.id)] == [first.handoff.items[0].item_id]
    assert jobs.postmortems_of(h.k, tenant, second.view.job.id) == []
    # Once it has finished, the incident is no longer busy: it has a post-mortem.
    third = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101"]), by="test")
    assert [i.error["code"] for i in jobs.list_items(h.k, tenant, third.view.job.id)] == ["exists"]


def test_a_job_never_locks_the_tenant_out_of_chat(harness_factory) -> None:
    from kortex.turns import chat

    h = harness_factory(llm={"budget": {"max_concurrent_turns_per_tenant": 1}})
    tenant = h.tenant("acme")
    h.seed(tenant, "incident-archive")
    submitted = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101", "INC-1110"], concurrency=2),
                            by="test")
    for item in submitted.handoff.items:
        jobs.start_item(h.k, tenant, item.item_id)  # two batch turns active
    session = chat.create_session(h.k, tenant, "ops")
    assert chat.post_message(h.k, tenant, session.id, "Why is checkout slow?").created  # chat still gets in


def test_a_second_job_skips_what_another_is_writing_and_tenants_share_the_lane(harness_factory) -> None:
    h = harness_factory(batch={"max_active_items_per_tenant": 4})
    tenant = h.tenant("acme")
    h.seed(tenant, "incident-archive")
    first = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101", "INC-1104", "INC-1107"],
                                                     concurrency=3), by="test")
    second = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101", "INC-1110", "INC-1113"],
                                                      concurrency=3), by="test")
    assert len(first.handoff.items) == 3 and len(second.handoff.items) == 1  # 4 in flight for the tenant
    [skipped] = jobs.list_items(h.k, tenant, second.view.job.id, status="skipped")
    assert skipped.incident_ref == "INC-1101" and skipped.error["code"] == "in_progress"  # never billed twice
    drive(h.k, first.handoff + second.handoff)
    from kortex.turns.watchdog import sweep

    for _ in range(10):  # the watchdog moves the second job on as the tenant's room frees up
        if jobs.view(h.k, tenant, second.view.job.id).job.status == "done":
            break
        drive(h.k, sweep(h.k).handoff)
    assert jobs.view(h.k, tenant, second.view.job.id).counts == {**dict.fromkeys(
        ("queued", "dispatched", "running", "failed", "cancelled"), 0), "done": 2, "skipped": 1}


def test_another_tenant_sees_no_job_item_or_post_mortem(h: Harness, tenant: str) -> None:
    submitted = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101"]), by="test")
    drive(h.k, submitted.handoff)
    other = h.tenant(f"pm-other-{uuid.uuid4().hex[:8]}")
    job_id = submitted.view.job.id
    for read in (lambda: jobs.view(h.k, other, job_id), lambda: jobs.list_items(h.k, other, job_id),
                 lambda: jobs.postmortem_of(h.k, other, "INC-1101"), lambda: jobs.postmortems_of(h.k, other, job_id),
                 lambda: jobs.cancel(h.k, other, job_id, by="x")):
        with pytest.raises(NotFound):
            read()
    with pytest.raises(NotFound) as missing:  # nor can it name the other tenant's incidents
        jobs.submit(h.k, other, jobs.JobRequest(incident_ids=["INC-1101"]), by="test")
    assert "INC-1101" in missing.value.message


def test_bad_requests_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="exactly one of incident_ids or filter"):
        jobs.JobRequest()
    with pytest.raises(ValueError, match="unknown template"):
        jobs.JobRequest(incident_ids=["INC-1"], template="haiku")
    with pytest.raises(ValueError, match="not incident ids"):
        jobs.JobRequest(incident_ids=["INC-1", "bad id with spaces"])
    with pytest.raises(ValueError):
        jobs.JobRequest(incident_ids=["INC-1"], concurrency=0)


def test_a_model_that_cannot_submit_a_valid_document_is_told_twice_then_the_item_fails(harness_factory,
                                                                                       fake) -> None:
    """Over the vendor's wire format: each invalid document comes back as a tool error naming
    what is wrong; the third fails the item with those errors, and no document is stored."""
    from tests.kortex.llm.conftest import vendor_config

    invalid = {"title": "x", "incident_id": "INC-1101", "severity": "error"}  # most of it missing
    step = {"text": ["Submitting."], "tool_calls": [{"name": "submit_postmortem", "arguments": invalid}]}
    fake.add("claude-opus-4-6", {"steps": [step, step, step, {"text": ["I give up."]}]})
    h = harness_factory(llm={"providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)},
                             "default_provider": "anthropic"})
    tenant = h.tenant("acme")
    h.seed(tenant, "incident-archive")
    submitted = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101"]), by="test")
    drive(h.k, submitted.handoff)
    [item] = jobs.list_items(h.k, tenant, submitted.view.job.id)
    assert item.status == "failed" and item.error["code"] == "invalid_postmortem", item.error
    assert "timeline" in json.dumps(item.error)  # the validation errors, as the model was told them
    assert len(fake.requests) == 3  # three answers, each rejected; no fourth call
    told = [m for m in fake.requests[-1].body["messages"] if m["role"] == "user" and isinstance(m["content"], list)]
    assert told and all(b.get("is_error") for m in told for b in m["content"] if b.get("type") == "tool_result")
    with pytest.raises(NotFound):
        jobs.postmortem_of(h.k, tenant, "INC-1101")
    assert jobs.view(h.k, tenant, submitted.view.job.id).job.status == "failed"  # nothing came of it
    with pytest.raises(Conflict) as refused:  # over, like a done job: there is nothing to stop
        jobs.cancel(h.k, tenant, submitted.view.job.id, by="test")
    assert refused.value.code == "job_finished" and refused.value.details == {"status": "failed"}


def test_a_real_model_s_document_is_stored_under_the_item_s_incident(harness_factory, fake) -> None:
    """The benchmark's scripted model (bench/batch.py) over the wire: it investigates once, cites
    that call, and names another incident id, which the job corrects and remembers."""
    from bench.batch import script
    from tests.kortex.llm.conftest import vendor_config

    fake.add("claude-opus-4-6", script())
    h = harness_factory(llm={"providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)},
                             "default_provider": "anthropic"})
    tenant = h.tenant("acme")
    h.seed(tenant, "incident-archive")
    drive(h.k, jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1116"]), by="test").handoff)
    stored = jobs.postmortem_of(h.k, tenant, "INC-1116")
    assert stored.document["incident_id"] == "INC-1116" and stored.document["root_cause"]["citations"] == ["toolu_pm_1"]
    assert stored.grounding == {"cited": 1, "dangling": [], "incident_id_given": "bench"}


def test_the_offline_analyst_submits_again_when_its_submission_was_lost_not_refused() -> None:
    """A submission whose worker died (the watchdog answers it as a timeout) is sent again; a
    document the tool refused is not, the refusal being the answer."""
    import asyncio

    from kortex.llm.base import CompletionRequest, ToolCallChunk, ToolSchema
    from kortex.llm.offline.provider import OfflineAnalyst
    from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage

    document = {"title": "x", "incident_id": "INC-1", "severity": "error"}
    question = UserMessage(content='Write the post-mortem of incident INC-1.\nincident: {"id": "INC-1", "title": "t"}')
    tools = (ToolSchema(name="submit_postmortem", description="", input_schema={"type": "object"}),)

    def next_calls(error_code: str) -> list[ToolCall]:
        call = ToolCall(id="call_1", name="submit_postmortem", arguments=document)
        result = ToolResult(call_id="call_1", name="submit_postmortem", is_error=True, error_code=error_code,
                            content={"error": True})
        request = CompletionRequest(messages=(question, AssistantMessage(content="", tool_calls=(call,)),
                                              ToolMessage(result=result)), tools=tools)

        async def run() -> list[ToolCall]:
            return [c.call async for c in OfflineAnalyst().stream(request) if isinstance(c, ToolCallChunk)]

        return asyncio.run(run())

    again = next_calls("timeout")
    assert [c.name for c in again] == ["submit_postmortem"] and again[0].arguments == document
    assert next_calls("validation") == []
