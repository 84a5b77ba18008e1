"""What one tenant may pile up in post-mortem jobs: its unfinished items across its jobs (a job
that would pass the cap is refused whole with 429, naming how many are open and the cap) and
new jobs a minute (429 with Retry-After). A refused job leaves nothing behind and costs no quota;
two jobs racing for the last open places cannot both get in (each counts under the tenant's lock).

Tenants are named afresh in each test: tests/integration/test_postmortem_quotas_pg.py runs these
on PostgreSQL and Redis, where the database outlives a test."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex import budget
from kortex.errors import KortexError, RateLimited
from kortex.postmortems import jobs
from kortex.storage import postmortems as store
from kortex.timeparse import utcnow
from kortex.turns.handoff import Handoff
from tests.api.conftest import bearer
from tests.conftest import Harness

#: the closed incidents `kortex seed incident-archive` loads
ARCHIVE = ["INC-1101", "INC-1104", "INC-1107", "INC-1110", "INC-1113", "INC-1116", "INC-1119", "INC-1122",
           "INC-1125", "INC-1128", "INC-1131", "INC-1134"]
OPEN = ("queued", "dispatched", "running")


@contextmanager
def served(h: Harness) -> Iterator[TestClient]:
    sent: list[Handoff] = []  # hand-offs are kept, never run: items stay open
    with TestClient(create_app(h.settings, dispatch=sent.append, embedded_worker=False)) as client:
        yield client


def archive_tenant(h: Harness) -> dict[str, str]:
    tenant = h.tenant(f"pm-quota-{uuid.uuid4().hex[:8]}")
    h.seed(tenant, "incident-archive")
    return bearer(h.api_key(tenant))


def open_items(client: TestClient, key: dict[str, str], job_ids: list[str]) -> int:
    """The tenant's unfinished items in these jobs, as a client reads them."""
    total = 0
    for job_id in job_ids:
        counts = client.get(f"/v1/postmortems/{job_id}", headers=key).json()["counts"]
        total += sum(counts[s] for s in OPEN)
    return total


def test_a_job_that_would_pass_the_tenants_open_items_is_refused_whole(harness_factory: Callable[..., Harness]) -> None:
    h = harness_factory(batch={"max_open_items_per_tenant": 5})
    with served(h) as client:
        key = archive_tenant(h)
        first = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[:3]}, headers=key)
        assert first.status_code == 202, first.text
        refused = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[3:6]}, headers=key)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_many_open_items"
        assert error["details"] == {"limit": "max_open_items_per_tenant", "open": 3, "requested": 3, "cap": 5}
        assert "3 post-mortem items" in error["message"] and "at most 5" in error["message"], error
        assert int(refused.headers["Retry-After"]) >= 1
        # Refused whole: none of its items was stored, so two more still fit, and then not one.
        fits = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[3:5]}, headers=key)
        assert fits.status_code == 202, fits.text
        assert open_items(client, key, [first.json()["job_id"], fits.json()["job_id"]]) == 5
        assert client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[5:6]}, headers=key).status_code == 429
        # Incidents another job is writing are skipped, not queued: such a job adds nothing open.
        again = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[:3], "force": True}, headers=key)
        assert again.status_code == 202, again.text
        assert client.get(again.json()["status_url"], headers=key).json()["counts"]["skipped"] == 3
        # Ending the first job's items makes room again.
        assert client.post(f"{first.json()['status_url']}/cancel", headers=key).status_code == 200
        later = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[5:8]}, headers=key)
        assert later.status_code == 202, later.text


def test_a_job_larger_than_the_cap_itself_is_refused_as_such(harness_factory: Callable[..., Harness]) -> None:
    """Waiting would never let it in: a 422 saying to narrow it, not a 429 to retry."""
    h = harness_factory(batch={"max_open_items_per_tenant": 2})
    with served(h) as client:
        key = archive_tenant(h)
        by_ids = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[:3]}, headers=key)
        assert by_ids.status_code == 422, by_ids.text
        assert by_ids.json()["error"]["details"][0]["field"] == "incident_ids"
        assert "at most 2" in by_ids.json()["error"]["message"]
        by_filter = client.post("/v1/postmortems", json={"filter": {"since": "30d"}}, headers=key)
        assert by_filter.status_code == 422 and by_filter.json()["error"]["details"][0]["field"] == "filter"
        assert client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[:2]}, headers=key).status_code == 202


def test_new_jobs_a_minute_are_limited_and_only_jobs_made_count(harness_factory: Callable[..., Harness],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    frozen = time.time()  # one window for the whole test: a minute turning over would reset the count
    monkeypatch.setattr(budget, "time", SimpleNamespace(time=lambda: frozen))
    h = harness_factory(batch={"jobs_per_minute": 2, "max_open_items_per_tenant": 2})
    with served(h) as client:
        key = archive_tenant(h)
        # Refused requests cost nothing: bad input, an unknown incident, the open-items cap.
        assert client.post("/v1/postmortems", json={"incident_ids": ["INC-1101"], "concurrency": 0},
                           headers=key).status_code == 422
        assert client.post("/v1/postmortems", json={"incident_ids": ["INC-9999"]}, headers=key).status_code == 404
        assert client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[:3]}, headers=key).status_code == 422
        first = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[:2]},
                            headers={**key, "Idempotency-Key": "pm-q-1"})
        assert first.status_code == 202, first.text
        capped = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[2:3]}, headers=key)
        assert capped.status_code == 429 and capped.json()["error"]["code"] == "too_many_open_items"
        # A second job: the one above was refused by the open-items cap, so it took no count.
        client.post(f"{first.json()['status_url']}/cancel", headers=key)
        second = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[2:3]}, headers=key)
        assert second.status_code == 202, second.text
        # The same request again under its Idempotency-Key answers the same job and counts nothing.
        replay = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[:2]},
                             headers={**key, "Idempotency-Key": "pm-q-1"})
        assert replay.status_code == 202 and replay.json()["job_id"] == first.json()["job_id"]
        third = client.post("/v1/postmortems", json={"incident_ids": ARCHIVE[3:4]}, headers=key)
        assert third.status_code == 429, third.text
        assert third.json()["error"]["details"] == {"limit": "postmortem_jobs"}
        assert "at most 2 post-mortem jobs a minute" in third.json()["error"]["message"]
        assert 1 <= int(third.headers["Retry-After"]) <= 60


def _ingest_incidents(client: TestClient, key: dict[str, str], refs: list[str]) -> None:
    opened = (utcnow() - timedelta(days=1)).isoformat()
    items = [{"ref": ref, "title": f"incident {ref}", "opened_at": opened} for ref in refs]
    assert client.post("/v1/ingest/incidents", json={"items": items}, headers=key).status_code == 200


def test_forced_jobs_never_queue_more_than_the_default_cap(harness: Harness) -> None:
    """The audit's case with the defaults: five forced jobs of 1,000 incidents queued 5,000 items."""
    with served(harness) as client:
        key = bearer(harness.api_key(harness.tenant(f"pm-forced-{uuid.uuid4().hex[:8]}")))
        some, others = [f"INC-{n}" for n in range(1000)], [f"OTHER-{n}" for n in range(1000)]
        _ingest_incidents(client, key, some)
        _ingest_incidents(client, key, others)
        answers = [client.post("/v1/postmortems", json={"incident_ids": chosen, "force": True}, headers=key)
                   for chosen in (some, others, some, others, some)]
        accepted = [a.json()["job_id"] for a in answers if a.status_code == 202]
        assert open_items(client, key, accepted) == 1000, [a.status_code for a in answers]
        assert answers[1].status_code == 429 and answers[1].json()["error"]["details"]["open"] == 1000


def test_two_jobs_racing_for_the_last_open_places_do_not_both_get_in(harness_factory: Callable[..., Harness],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness_factory(batch={"max_open_items_per_tenant": 4})
    tenant = h.tenant(f"pm-race-{uuid.uuid4().hex[:8]}")
    h.seed(tenant, "incident-archive")
    jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=ARCHIVE[:2]), by="test")
    both_counted = threading.Barrier(2, timeout=1)
    real = store.tenant_open_count

    def slow_count(conn: Any, tenant_id: str) -> int:
        counted = real(conn, tenant_id)
        try:  # hold the count open until the other job has counted too, if it can
            both_counted.wait()
        except threading.BrokenBarrierError:
            pass
        return counted

    monkeypatch.setattr(store, "tenant_open_count", slow_count)
    outcomes: list[str | BaseException] = []

    def submit(refs: list[str]) -> None:
        try:
            outcomes.append(jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=refs), by="test").view.job.id)
        except KortexError as exc:
            outcomes.append(exc)

    racers = [threading.Thread(target=submit, args=(refs,)) for refs in (ARCHIVE[2:4], ARCHIVE[4:6])]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(30)
    assert sorted(type(o).__name__ for o in outcomes) == ["RateLimited", "str"], outcomes
    assert next(o for o in outcomes if isinstance(o, RateLimited)).details["open"] == 4
    with h.k.db.connect() as conn:
        assert store.tenant_open_count(conn, tenant) == 4
