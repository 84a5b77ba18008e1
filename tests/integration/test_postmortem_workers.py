"""Post-mortem jobs on the deployment's own shape: a `kortex worker --queues batch` process, the
watchdog (`kortex beat`), the API, real PostgreSQL and Redis. A job completes; a batch worker
killed with SIGKILL mid-job is replaced and the job still completes, with one document and one
turn per item and no step billed twice; a cancel stops it; another tenant sees nothing.

It runs on a database and Redis prefix of its own: the shared services of the session run a
narrower tool policy, and their watchdog would re-send this module's batch work into queues
nobody here consumes."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from kortex.postmortems.document import PostMortem
from kortex.storage.schema import decisions, postmortem_items, postmortems
from kortex.testing.scratch import throwaway_database, throwaway_prefix
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN, REDIS_URL, Service, _free_port, service_env

pytestmark = pytest.mark.integration


class Deployment:
    def __init__(self, url: str, prefix: str, logs: Path) -> None:
        self.url, self.prefix, self.logs = url, prefix, logs
        env = service_env(url, prefix, KORTEX_TURN__REQUEUE_AFTER="2", KORTEX_TURN__STEP_LEASE="3",
                          KORTEX_TURN__WATCHDOG_EVERY="0.5")
        env.pop("KORTEX_TOOLS__ALLOWED")  # the default policy: every read-only tool and submit_postmortem
        self.env = env
        self.workers: list[Service] = []
        self.beat = Service("beat", [sys.executable, "-m", "kortex_cli.main", "beat"], env, logs / "beat.log")
        self.beat.wait_for(lambda: "watchdog took the lead" in self.beat.output())
        port = _free_port()
        self.api = Service("api", [sys.executable, "-m", "kortex_cli.main", "api", "--host", "127.0.0.1",
                                   "--port", str(port), "--workers", "1"], env, logs / "api.log")
        self.api_url = f"http://127.0.0.1:{port}"
        self.api.wait_for(self._ready)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self) -> Service:
        n = len(self.workers)
        worker = Service(f"batch worker {n}", [sys.executable, "-m", "kortex_cli.main", "worker", "--queues", "batch",
                                               "--concurrency", "8"], self.env, self.logs / f"batch-{n}.log")
        worker.wait_for(lambda: " ready." in worker.output())
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for service in [*self.workers, self.api, self.beat]:
            service.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with throwaway_database(PG_ADMIN, prefix="kortex_pm", migrated=True) as (url, _name), \
            throwaway_prefix(REDIS_URL, "kxpm") as prefix:
        d = Deployment(url, prefix, tmp_path_factory.mktemp("pm-services"))
        try:
            yield d
        finally:
            d.stop()


@pytest.fixture(scope="module")
def h(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    harness = Harness(make_settings(tmp_path_factory.mktemp("pm-harness"), deployment.url, redis_url=REDIS_URL,
                                    redis_prefix=deployment.prefix))
    yield harness
    harness.close()


def _tenant(h: Harness) -> tuple[str, dict[str, str]]:
    tenant = h.tenant(f"pm-{uuid.uuid4().hex[:8]}")
    h.seed(tenant, "incident-archive")
    return tenant, {"Authorization": f"Bearer {h.api_key(tenant)}"}


def _wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _status(d: Deployment, headers: dict[str, str], job_id: str) -> dict[str, Any]:
    return httpx.get(f"{d.api_url}/v1/postmortems/{job_id}", headers=headers, timeout=10).json()  # type: ignore[no-any-return]


def test_a_job_of_ten_incidents_completes_with_ten_valid_post_mortems(deployment: Deployment, h: Harness) -> None:
    if not deployment.workers:
        deployment.start_worker()
    tenant, headers = _tenant(h)
    ids = ["INC-1101", "INC-1104", "INC-1107", "INC-1110", "INC-1113", "INC-1116", "INC-1119", "INC-1122",
           "INC-1125", "INC-1128"]
    accepted = httpx.post(f"{deployment.api_url}/v1/postmortems", json={"incident_ids": ids, "concurrency": 4},
                          headers=headers, timeout=10)
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["job_id"]
    status = _wait(lambda: (s := _status(deployment, headers, job_id))["finished_at"] and s, 120, "the job")
    assert status["status"] == "done" and status["counts"]["done"] == 10, status
    for ref in ids:
        response = httpx.get(f"{deployment.api_url}/v1/incidents/{ref}/postmortem", headers=headers, timeout=10)
        assert response.status_code == 200, response.text
        body = response.json()
        assert PostMortem.model_validate(body["document"]).incident_id == ref and body["grounding"]["dangling"] == []
    # Another tenant sees none of it.
    _, other = _tenant(h)
    assert httpx.get(f"{deployment.api_url}/v1/postmortems/{job_id}", headers=other).status_code == 404
    assert httpx.get(f"{deployment.api_url}/v1/incidents/INC-1101/postmortem", headers=other).status_code == 404


def test_a_batch_worker_killed_mid_job_is_replaced_and_the_job_completes_once(deployment: Deployment,
                                                                             h: Harness) -> None:
    victim = deployment.workers[-1] if deployment.workers else deployment.start_worker()
    tenant, headers = _tenant(h)
    accepted = httpx.post(f"{deployment.api_url}/v1/postmortems", json={"filter": {"since": "30d"}, "concurrency": 3},
                          headers=headers, timeout=10).json()
    job_id = accepted["job_id"]
    _wait(lambda: (c := _status(deployment, headers, job_id)["counts"])["done"] >= 2 and c["running"] >= 1, 120,
          "items done and running")
    os.killpg(victim.proc.pid, signal.SIGKILL)  # the worker and its children, mid-job
    victim.proc.wait(10)
    deployment.start_worker()
    status = _wait(lambda: (s := _status(deployment, headers, job_id))["finished_at"] and s, 180, "the job to finish")
    assert status["status"] == "done" and status["counts"]["done"] == accepted["items"], status

    with h.k.db.connect() as conn:
        items = conn.execute(select(postmortem_items).where(postmortem_items.c.job_id == job_id)).all()
        per_item = dict(conn.execute(select(postmortems.c.item_id, func.count()).where(postmortems.c.job_id == job_id)
                                     .group_by(postmortems.c.item_id)).all())
        turn_ids = [i.turn_id for i in items]
        calls = conn.execute(select(decisions.c.turn_id, decisions.c.payload)
                             .where(decisions.c.turn_id.in_(turn_ids), decisions.c.kind == "llm_call",
                                    decisions.c.ok.is_(True))).all()
    billed = Counter((c.turn_id, c.payload["step"]) for c in calls)
    assert len(set(turn_ids)) == len(items) == accepted["items"]  # one turn per item, never a second
    assert set(per_item) == {i.id for i in items} and set(per_item.values()) == {1}  # one document per item
    assert billed and set(billed.values()) == {1}, "a step's successful LLM call is billed once"


def test_cancel_stops_a_running_job(deployment: Deployment, h: Harness) -> None:
    if not deployment.workers:
        deployment.start_worker()
    tenant, headers = _tenant(h)
    job_id = httpx.post(f"{deployment.api_url}/v1/postmortems", json={"filter": {"since": "30d"}, "concurrency": 1},
                        headers=headers, timeout=10).json()["job_id"]
    response = httpx.post(f"{deployment.api_url}/v1/postmortems/{job_id}/cancel", params={"running": "cancel"},
                          headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    status = _wait(lambda: (s := _status(deployment, headers, job_id))["counts"]["running"] == 0
                   and s["counts"]["dispatched"] == 0 and s, 60, "the job to stop")
    assert status["status"] == "cancelled" and status["counts"]["queued"] == 0
    assert status["counts"]["cancelled"] + status["counts"]["done"] == sum(status["counts"].values())
    assert status["counts"]["cancelled"] >= sum(status["counts"].values()) - 1
