"""POST /v1/ingest/{kind} on PostgreSQL, whose INTEGER columns are 32-bit and whose jsonb has no
NaN: what would not fit is a 422 naming the field, never a storage error. (SQLite takes both.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.main import create_app
from kortex.storage.schema import llm_deployments, llm_requests, llm_users, telemetry_spans
from kortex.timeparse import isoformat, utcnow
from tests.conftest import Harness, make_settings

pytestmark = pytest.mark.integration

INT32_MAX = 2**31 - 1
TS = isoformat(utcnow() - timedelta(minutes=1))
# Each LLM-ops kind with its INTEGER fields at the largest value the column holds.
AT_MAX: dict[str, tuple[Any, dict[str, Any]]] = {
    "llm-deployments": (llm_deployments, {
        "deployment_id": "vllm/dep-1", "model_id": "m1", "backend_id": "b1", "status": "healthy", "updated_at": TS,
        "queue_depth": INT32_MAX, "rate_limit_remaining": INT32_MAX, "sample_count": INT32_MAX}),
    "llm-users": (llm_users, {"user_id": "u1", "tier": "premium", "latency_sla_ms": INT32_MAX}),
    "llm-requests": (llm_requests, {
        "request_id": "r1", "user_id": "u1", "user_tier": "premium", "deployment_id": "vllm/dep-1", "model_id": "m1",
        "backend_id": "b1", "status": "success", "created_at": TS,
        "input_tokens": INT32_MAX, "output_tokens": INT32_MAX, "latency_ms": INT32_MAX}),
}
INT_FIELDS = {"queue_depth", "rate_limit_remaining", "sample_count", "latency_sla_ms", "input_tokens",
              "output_tokens", "latency_ms"}


@pytest.fixture(scope="module")
def pg(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    h = Harness(make_settings(tmp_path_factory.mktemp("pg-ingest"), pg_url))
    yield h
    h.close()


@pytest.fixture(scope="module")
def client(pg: Harness) -> Iterator[TestClient]:
    app = create_app(pg.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _post(client: TestClient, key: str, kind: str, items: list[Any]) -> Any:
    # Raw JSON, so a test can send the Infinity that Python's parser reads and jsonb refuses.
    return client.post(f"/v1/ingest/{kind}", content=json.dumps({"items": items}).encode(),
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def test_integers_fill_their_32_bit_columns_and_no_further(pg: Harness, client: TestClient) -> None:
    tenant = pg.tenant(f"pg-ingest-{uuid.uuid4().hex[:6]}")
    key = pg.api_key(tenant)
    for kind, (table, item) in AT_MAX.items():
        assert _post(client, key, kind, [item]).status_code == 200, kind
        names = INT_FIELDS & set(item)
        with pg.k.db.connect() as conn:
            stored = conn.execute(select(table).where(table.c.tenant_id == tenant)).mappings().one()
        assert {n: stored[n] for n in names} == dict.fromkeys(names, INT32_MAX), kind
        for name in names:
            response = _post(client, key, kind, [{**item, name: INT32_MAX + 1}])
            assert response.status_code == 422, (kind, name, response.json())
            assert [d["field"] for d in response.json()["error"]["details"]] == [name]


def test_a_day_long_span_fits_its_bigint_column(pg: Harness, client: TestClient) -> None:
    tenant = pg.tenant(f"pg-ingest-{uuid.uuid4().hex[:6]}")
    span = {"trace_id": "t1", "span_id": "s1", "service": "checkout", "operation": "op", "start": TS,
            "duration_us": 86_400_000_000}
    assert _post(client, pg.api_key(tenant), "spans", [span]).status_code == 200
    with pg.k.db.connect() as conn:
        assert conn.execute(select(telemetry_spans.c.duration_us)
                            .where(telemetry_spans.c.tenant_id == tenant)).scalar_one() == 86_400_000_000


def test_non_finite_numbers_in_json_fields_are_a_422(pg: Harness, client: TestClient) -> None:
    key = pg.api_key(pg.tenant(f"pg-ingest-{uuid.uuid4().hex[:6]}"))
    log = {"product": "checkout", "ts": TS, "level": "error", "message": "m", "attrs": {"ratio": float("inf")}}
    response = _post(client, key, "logs", [log])
    assert response.status_code == 422, response.json()
    assert response.json()["error"]["details"][0]["field"] == "attrs"
