"""The post-mortem job tests of tests/kortex/postmortems/test_jobs.py, on PostgreSQL: the skip-
locked dispatch, the insert that keeps one document per item (its answer read from RETURNING,
not rowcount) and every compare-and-set run on the real database."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, func, select, update

from kortex.postmortems import jobs
from kortex.storage import postmortems as store
from kortex.storage.schema import turns as turns_table
from kortex.timeparse import utcnow
from kortex.turns.handoff import Handoff
from tests.conftest import Harness, make_settings
from tests.kortex.postmortems.test_jobs import (  # noqa: F401 - collected here, on PostgreSQL
    tenant,
    test_a_job_cancelled_with_finish_still_owns_its_running_incident,
    test_a_job_writes_one_valid_cited_post_mortem_per_incident,
    test_another_tenant_sees_no_job_item_or_post_mortem,
    test_cancel_stops_queued_items_and_cancels_running_ones_when_asked,
    test_cancel_with_finish_lets_the_running_item_finish,
    test_max_usd_stops_the_job_before_the_next_llm_call,
    test_running_twice_never_writes_two_and_a_rerun_skips_what_is_done,
    test_the_same_idempotency_key_answers_the_same_job,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def h(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """A container on the test database with the default tool policy (the post-mortem profile's tools)."""
    harness = Harness(make_settings(tmp_path_factory.mktemp("pg-postmortems"), pg_url))
    yield harness
    harness.close()


def _archive_tenant(h: Harness) -> str:
    tenant_id = h.tenant(f"pm-{uuid.uuid4().hex[:8]}")
    h.seed(tenant_id, "incident-archive")
    return tenant_id


def test_starting_an_item_and_cancelling_its_job_at_once_do_not_deadlock(h: Harness, monkeypatch) -> None:
    """start_item's budget path and cancel lock the job's row before its items' rows, in that
    order both: before, one held the item and waited for the job while the other did the reverse."""
    tenant_id = _archive_tenant(h)
    submitted = jobs.submit(h.k, tenant_id, jobs.JobRequest(incident_ids=["INC-1101", "INC-1110", "INC-1116"],
                                                         concurrency=2, max_usd=0.01), by="test")
    first, second = submitted.handoff.items
    step0 = jobs.start_item(h.k, tenant_id, first.item_id)
    with h.k.db.begin() as conn:  # the job's budget is spent: the next start takes the skip path
        conn.execute(update(turns_table).where(turns_table.c.id == step0.steps[0].turn_id).values(cost_usd=0.02))
    go = threading.Event()
    real = jobs.advance

    def slow_advance(*args, **kwargs):  # hold start_item's locks while cancel comes in
        go.wait(5)
        return real(*args, **kwargs)

    monkeypatch.setattr(jobs, "advance", slow_advance)
    errors: dict[str, BaseException] = {}

    def run(name, fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[name] = exc

    starter = threading.Thread(target=run, args=("start_item", lambda: jobs.start_item(h.k, tenant_id, second.item_id)))
    starter.start()
    time.sleep(0.5)
    canceller = threading.Thread(target=run, args=("cancel", lambda: jobs.cancel(h.k, tenant_id, submitted.view.job.id,
                                                                                  by="key:test")))
    canceller.start()
    time.sleep(0.5)
    go.set()
    starter.join(20)
    canceller.join(20)
    assert not errors, {k: repr(v) for k, v in errors.items()}
    assert jobs.view(h.k, tenant_id, submitted.view.job.id).job.status == "cancelled"


def test_two_deliveries_of_an_item_s_task_at_once_start_it_once_and_neither_fails(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both deliveries read the item as dispatched before either takes the job's lock: the one
    that gets it second finds the item started and does nothing, rather than failing the task."""
    tenant_id = _archive_tenant(h)
    submitted = jobs.submit(h.k, tenant_id, jobs.JobRequest(incident_ids=["INC-1101"]), by="test")
    [item] = submitted.handoff.items
    both_read = threading.Barrier(2)
    first_read = threading.local()
    real = store.get_item

    def get_item(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        if not getattr(first_read, "done", False):
            first_read.done = True
            both_read.wait(5)
        return found

    monkeypatch.setattr(store, "get_item", get_item)
    results: list[Any] = []

    def deliver() -> None:
        try:
            results.append(jobs.start_item(h.k, tenant_id, item.item_id))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            results.append(exc)

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(len(r.steps) for r in results) == [0, 1] and Handoff() in results
    with h.k.db.connect() as conn:
        assert real(conn, tenant_id, item.item_id).status == "running"
        assert conn.execute(select(func.count()).where(turns_table.c.tenant_id == tenant_id)).scalar() == 1


def test_two_jobs_of_a_tenant_advancing_at_once_keep_to_its_cap(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each advance counts the tenant's items in flight under the tenant's lock: before, both
    counted none in flight and each dispatched one, two with a cap of one."""
    tenant_id = _archive_tenant(h)
    a = jobs.submit(h.k, tenant_id, jobs.JobRequest(incident_ids=["INC-1101", "INC-1110"], concurrency=1), by="test")
    b = jobs.submit(h.k, tenant_id, jobs.JobRequest(incident_ids=["INC-1116", "INC-1104"], concurrency=1), by="test")
    with h.k.db.begin() as conn:  # nothing in flight; each job has one item queued
        for dispatched in a.handoff.items + b.handoff.items:
            assert store.end_item(conn, tenant_id, dispatched.item_id, "skipped", utcnow(), from_status=("dispatched",))
    # Hold each advance at the count until the other has come to it too. With the tenant locked
    # the second never gets there while the first waits, so the wait is short and may lapse.
    both_counting = threading.Barrier(2)
    real = store.tenant_active_count

    def tenant_active_count(*args: Any, **kwargs: Any) -> int:
        try:
            both_counting.wait(1)
        except threading.BrokenBarrierError:
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "tenant_active_count", tenant_active_count)
    dispatched: dict[str, Any] = {}

    def advance(job_id: str) -> None:
        try:
            with h.k.db.begin() as conn:
                dispatched[job_id] = len(jobs.advance(conn, tenant_id, job_id, utcnow(), 1).items)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            dispatched[job_id] = exc

    threads = [threading.Thread(target=advance, args=(s.view.job.id,)) for s in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(dispatched.values()) == [0, 1], dispatched  # one of them, and only one, dispatched
    with h.k.db.connect() as conn:
        assert real(conn, tenant_id) == 1


def test_spend_never_dips_while_an_item_settles(h: Harness) -> None:
    """An item that settles while the spend is read is counted once, as running or as settled:
    before, its settled cost was read before it settled and its turn's after, and it was lost."""
    tenant_id = _archive_tenant(h)
    submitted = jobs.submit(h.k, tenant_id, jobs.JobRequest(incident_ids=["INC-1101"]), by="test")
    [item] = submitted.handoff.items
    turn_id = jobs.start_item(h.k, tenant_id, item.item_id).steps[0].turn_id
    with h.k.db.begin() as conn:
        conn.execute(update(turns_table).where(turns_table.c.id == turn_id).values(cost_usd=1.0))
    settled: list[bool] = []

    def settle_first(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "JOIN turns" in statement and not settled:  # the item ends (on_end) just before turns are read
            with h.k.db.begin() as other:
                settled.append(store.end_item(other, tenant_id, item.item_id, "done", utcnow(), cost_usd=1.0))

    with h.k.db.connect() as conn:
        assert store.spend(conn, tenant_id, submitted.view.job.id) == pytest.approx(1.0)  # running
        event.listen(conn, "before_cursor_execute", settle_first)
        spent = store.spend(conn, tenant_id, submitted.view.job.id)
    assert settled == [True] and spent == pytest.approx(1.0)
