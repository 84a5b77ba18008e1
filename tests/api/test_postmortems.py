"""The post-mortem endpoints: a job is accepted with its links, read with its counts, paged by
item, followed as SSE progress, cancelled; the document is served as JSON or Markdown; another
tenant finds none of it; bad requests are 422 with the field named."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.testing.inline import drive
from kortex.turns.handoff import Handoff
from tests.api.conftest import bearer
from tests.conftest import Harness


@pytest.fixture
def sent() -> list[Handoff]:
    return []


@pytest.fixture
def api(harness: Harness, sent: list[Handoff]) -> Iterator[TestClient]:
    # Hand-offs are kept, and run by the test when it wants the work done.
    app = create_app(harness.settings, dispatch=sent.append, embedded_worker=False)
    with TestClient(app) as c:
        yield c


@pytest.fixture
def acme(harness: Harness) -> dict[str, str]:
    tenant = harness.tenant("acme")
    harness.seed(tenant, "incident-archive")
    return bearer(harness.api_key(tenant))


def _run(harness: Harness, sent: list[Handoff]) -> None:
    while sent:
        drive(harness.k, sent.pop(0))


def _sse(text: str) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            out.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return out


def test_a_job_is_accepted_run_read_and_followed(api: TestClient, harness: Harness, sent: list[Handoff],
                                                 acme: dict[str, str]) -> None:
    body = {"incident_ids": ["INC-1101", "INC-1116", "INC-1110"], "concurrency": 2}
    accepted = api.post("/v1/postmortems", json=body, headers={**acme, "Idempotency-Key": "pm-1"})
    assert accepted.status_code == 202, accepted.text
    job = accepted.json()
    assert job["items"] == 3 and job["status_url"] == f"/v1/postmortems/{job['job_id']}"
    again = api.post("/v1/postmortems", json=body, headers={**acme, "Idempotency-Key": "pm-1"})
    assert again.json()["job_id"] == job["job_id"]  # the same job, and nothing more dispatched
    assert len(sent) == 1 and len(sent[0].items) == 2

    _run(harness, sent)

    status = api.get(job["status_url"], headers=acme).json()
    assert status["status"] == "done" and status["counts"]["done"] == 3 and status["finished_at"]
    page = api.get(f"{job['status_url']}/items", params={"limit": 2}, headers=acme).json()
    assert [i["incident_id"] for i in page["items"]] == ["INC-1101", "INC-1116"] and page["next_after"] == 1
    rest = api.get(f"{job['status_url']}/items", params={"after": 1}, headers=acme).json()
    assert [i["incident_id"] for i in rest["items"]] == ["INC-1110"] and rest["next_after"] is None
    link = page["items"][0]["postmortem_url"]
    assert link == "/v1/incidents/INC-1101/postmortem"

    document = api.get(link, headers=acme).json()
    assert document["incident_id"] == "INC-1101" and document["grounding"]["dangling"] == []
    assert document["document"]["root_cause"]["citations"]
    markdown = api.get(link, headers={**acme, "Accept": "text/markdown"})
    assert markdown.headers["content-type"].startswith("text/markdown")
    assert markdown.text.startswith("# Post-mortem: checkout p99 up after v2.11.0")

    events = _sse(api.get(job["events_url"], headers=acme).text)
    kinds = [e for _, e, _ in events]
    assert kinds.count("item_started") == 3 and kinds.count("item_done") == 3 and kinds[-1] == "job_done"
    assert [int(i) for i, _, _ in events] == list(range(1, len(events) + 1))  # numbered, none missing
    documents = api.get(f"{job['status_url']}/documents", headers=acme).json()["documents"]
    assert sorted(d["incident_id"] for d in documents) == ["INC-1101", "INC-1110", "INC-1116"]
    assert events[-1][2]["counts"]["done"] == 3
    # Reconnecting after an event replays only what came after it.
    middle = events[2][0]
    resumed = _sse(api.get(job["events_url"], headers={**acme, "Last-Event-ID": middle}).text)
    assert [e for _, e, _ in resumed] == kinds[3:]


def test_cancel_answers_what_it_stopped(api: TestClient, harness: Harness, sent: list[Handoff],
                                        acme: dict[str, str]) -> None:
    job = api.post("/v1/postmortems", json={"filter": {"since": "30d"}, "concurrency": 1}, headers=acme).json()
    cancelled = api.post(f"/v1/postmortems/{job['job_id']}/cancel", headers=acme)
    assert cancelled.status_code == 200, cancelled.text
    body = cancelled.json()
    assert body["job"]["status"] == "cancelled" and body["running_action"] == "finish"
    # Not started yet, the dispatched one included: its task, when it comes, finds it cancelled.
    assert body["cancelled_queued"] == job["items"] and body["running"] == 0
    _run(harness, sent)
    assert api.get(f"/v1/postmortems/{job['job_id']}", headers=acme).json()["counts"]["cancelled"] == job["items"]


def test_another_tenant_sees_none_of_it(api: TestClient, harness: Harness, sent: list[Handoff],
                                        acme: dict[str, str]) -> None:
    job = api.post("/v1/postmortems", json={"incident_ids": ["INC-1101"]}, headers=acme).json()
    _run(harness, sent)
    other = bearer(harness.api_key(harness.tenant("globex")))
    for method, url in (("GET", job["status_url"]), ("GET", f"{job['status_url']}/items"),
                        ("GET", job["events_url"]), ("POST", f"{job['status_url']}/cancel"),
                        ("GET", "/v1/incidents/INC-1101/postmortem")):
        response = api.request(method, url, headers=other)
        assert response.status_code == 404, (method, url, response.text)
    response = api.post("/v1/postmortems", json={"incident_ids": ["INC-1101"]}, headers=other)
    assert response.status_code == 404 and "INC-1101" in response.json()["error"]["message"]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "body"),
    ({"incident_ids": ["INC-1"], "filter": {"since": "1d"}}, "body"),
    ({"incident_ids": ["has space"]}, "incident_ids"),
    ({"filter": {"since": "whenever"}}, "filter.since"),
    ({"incident_ids": ["INC-1"], "concurrency": 0}, "concurrency"),
    ({"incident_ids": ["INC-1"], "max_usd": -1}, "max_usd"),
    ({"incident_ids": ["INC-1"], "template": "haiku"}, "template"),
    ({"incident_ids": ["INC-1"], "model": "nope:nothing"}, None),
])
def test_bad_requests_are_4xx_and_name_the_field(api: TestClient, acme: dict[str, str], body: dict[str, Any],
                                                  field: str | None) -> None:
    response = api.post("/v1/postmortems", json=body, headers=acme)
    assert 400 <= response.status_code < 500 and response.status_code != 404, response.text
    if field is not None and field != "body":
        assert field in json.dumps(response.json()["error"]), response.text


def test_ids_that_cannot_exist_are_404_not_500(api: TestClient, acme: dict[str, str]) -> None:
    assert api.get("/v1/postmortems/not-a-uuid", headers=acme).status_code == 404
    assert api.get(f"/v1/postmortems/{uuid.uuid4()}", headers=acme).status_code == 404
    assert api.get("/v1/incidents/INC-9999/postmortem", headers=acme).status_code == 404
    assert api.get("/v1/incidents/bad%20ref/postmortem", headers=acme).status_code == 422
    job = api.post("/v1/postmortems", json={"incident_ids": ["INC-1101"]}, headers=acme).json()
    for bad in ("2020-01-01T00:00:00", "-1", "x"):
        response = api.get(job["events_url"], headers={**acme, "Last-Event-ID": bad})
        assert response.status_code == 422 and "Last-Event-ID" in response.text, bad
