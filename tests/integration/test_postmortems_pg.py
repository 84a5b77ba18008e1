"""The post-mortem job tests of tests/kortex/postmortems/test_jobs.py, on PostgreSQL: the skip-
locked dispatch, the insert that keeps one document per item (its answer read from RETURNING,
not rowcount) and every compare-and-set run on the real database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Harness, make_settings
from tests.kortex.postmortems.test_jobs import (  # noqa: F401 - collected here, on PostgreSQL
    tenant,
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


def test_starting_an_item_and_cancelling_its_job_at_once_do_not_deadlock(h: Harness, monkeypatch) -> None:
    """start_item's budget path and cancel lock the job's row before its items' rows, in that
    order both: before, one held the item and waited for the job while the other did the reverse."""
    import threading
    import time
    import uuid

    from sqlalchemy import update

    from kortex.postmortems import jobs
    from kortex.storage.schema import turns as turns_table

    tenant_id = h.tenant(f"pm-{uuid.uuid4().hex[:8]}")
    h.seed(tenant_id, "incident-archive")
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
