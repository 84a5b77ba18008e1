"""`GET /v1/postmortems/{id}/documents` is paged: up to 1,000 documents of a job came in one
answer. Pages of `limit` (a default, a most), in incident order, `next_after` reads the next."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.testing.inline import drive
from kortex.turns.handoff import Handoff
from tests.api.conftest import bearer
from tests.api.test_postmortem_quotas import ARCHIVE
from tests.conftest import Harness

WRITTEN = ARCHIVE[:5]


class Done:
    """A finished job of five incidents, with its tenant's key."""

    def __init__(self, client: TestClient, key: dict[str, str], job_id: str) -> None:
        self.client, self.key, self.job_id = client, key, job_id

    def get(self, **params: str | int) -> Any:  # the test client's response
        return self.client.get(f"/v1/postmortems/{self.job_id}/documents", params=params, headers=self.key)


@contextmanager
def finished_job(harness: Harness) -> Iterator[Done]:
    """A job of five incidents run to its end, on an API over ``harness``."""
    sent: list[Handoff] = []
    with TestClient(create_app(harness.settings, dispatch=sent.append, embedded_worker=False)) as client:
        tenant = harness.tenant(f"pm-docs-{uuid.uuid4().hex[:8]}")
        harness.seed(tenant, "incident-archive")
        key = bearer(harness.api_key(tenant))
        accepted = client.post("/v1/postmortems", json={"incident_ids": WRITTEN[::-1], "concurrency": 4},
                               headers=key)
        assert accepted.status_code == 202, accepted.text
        while sent:
            drive(harness.k, sent.pop(0))
        job_id = accepted.json()["job_id"]
        assert client.get(f"/v1/postmortems/{job_id}", headers=key).json()["counts"]["done"] == 5
        yield Done(client, key, job_id)


@pytest.fixture
def done(harness: Harness) -> Iterator[Done]:
    with finished_job(harness) as job:
        yield job


def test_documents_are_read_page_by_page_in_incident_order(done: Done) -> None:
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        response = done.get(limit=2, **({"after": after} if after else {}))
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["documents"]) <= 2
        seen += [d["incident_id"] for d in page["documents"]]
        assert all(d["job_id"] == done.job_id and d["document"]["summary"] for d in page["documents"])
        pages += 1
        after = page["next_after"]
        if after is None:
            break
        assert after == seen[-1]
    assert seen == sorted(WRITTEN) and pages == 3


def test_a_page_has_a_default_size_and_a_most(done: Done) -> None:
    whole = done.get().json()
    assert [d["incident_id"] for d in whole["documents"]] == sorted(WRITTEN) and whole["next_after"] is None
    assert done.get(limit=50).status_code == 200
    for refused in ({"limit": 0}, {"limit": 51}, {"after": "not an id!"}, {"after": "x" * 65}):
        response = done.get(**refused)
        assert response.status_code == 422, refused
        assert response.json()["error"]["details"][0]["field"] == next(iter(refused))
    assert done.get(after=sorted(WRITTEN)[-1]).json() == {"documents": [], "next_after": None}
