"""/openapi.json is a document a client generator can use: valid OpenAPI, a bearer security
scheme, every operation described, errors in the body this API really sends, typed ingest items
and turn events; and every operation in it answers (no route is documented but missing)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from openapi_spec_validator import validate

from api.main import create_app
from kortex.telemetry import ingest
from tests.conftest import Harness


@pytest.fixture
def client(harness: Harness) -> Iterator[TestClient]:
    with TestClient(create_app(harness.settings, dispatch=lambda handoff: None, embedded_worker=False)) as c:
        yield c


def _operations(doc: dict) -> list[tuple[str, str, dict]]:
    return [(path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()]


def test_the_document_is_valid_openapi_with_a_bearer_scheme_and_every_operation_described(client) -> None:
    doc = client.get("/openapi.json").json()
    validate(doc)  # raises on any violation of the OpenAPI specification
    assert doc["components"]["securitySchemes"]["api_key"] == {
        "type": "http", "scheme": "bearer", "bearerFormat": "kx_<key id>_<secret>",
        "description": doc["components"]["securitySchemes"]["api_key"]["description"]}
    for path, method, op in _operations(doc):
        assert op.get("description", "").strip(), f"{method.upper()} {path} has no description"
        if path.startswith("/v1/"):
            assert op.get("security") == [{"api_key": []}], f"{method.upper()} {path} does not say it needs a key"


def test_errors_are_documented_as_the_body_the_api_sends(client, harness) -> None:
    doc = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    body = doc["components"]["schemas"]["ErrorBody"]
    assert body["required"] == ["error"]
    for path, method, op in _operations(doc):
        for status, response in op["responses"].items():
            if status[0] in "45":
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, f"{method} {path} {status}"
    # and the body sent is that shape, for a validation error too
    key = harness.api_key(harness.tenant("acme"))
    sent = client.post("/v1/sessions", json={"name": 5}, headers={"Authorization": f"Bearer {key}"}).json()
    assert set(sent) == {"error"} and {"code", "message", "details"} >= set(sent["error"]) >= {"code", "message"}


def test_ingest_items_and_turn_events_have_schemas(client) -> None:
    doc = client.get("/openapi.json").json()
    post = doc["paths"]["/v1/ingest/{kind}"]["post"]
    kind = next(p for p in post["parameters"] if p["name"] == "kind")
    assert kind["schema"]["enum"] == list(ingest.KINDS)
    refs = post["requestBody"]["content"]["application/json"]["schema"]["properties"]["items"]["items"]["oneOf"]
    names = {r["$ref"].rsplit("/", 1)[1] for r in refs}
    assert names == {spec[0].__name__ for spec in ingest.KINDS.values()}
    assert "message" in doc["components"]["schemas"]["LogItem"]["properties"]
    stream = doc["paths"]["/v1/turns/{turn_id}/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
    events = stream["x-sse-events"]
    assert set(events) == {"turn", "text", "tool_call", "tool_progress", "tool_result", "proposal", "error", "route",
                           "anomaly", "recovery", "done"}
    done = doc["components"]["schemas"][events["done"]["$ref"].rsplit("/", 1)[1]]
    assert done["properties"]["status"]["enum"] == ["done", "failed", "cancelled"]
    assert {"attempt", "seq"} <= set(doc["components"]["schemas"]["TextEvent"]["properties"])


def test_every_documented_operation_is_served(client, harness) -> None:
    doc = client.get("/openapi.json").json()
    key = harness.api_key(harness.tenant("acme"))
    headers = {"Authorization": f"Bearer {key}"}
    for path, method, _op in _operations(doc):
        url = re.sub(r"\{kind\}", "logs", path)
        url = re.sub(r"\{[a-z_]+\}", str(uuid.uuid4()), url)
        response = client.request(method.upper(), url, headers=headers, json={})
        # An unknown object is our own 404 ("session not found"); a missing route would be
        # Starlette's "Not Found", and a missing method a 405.
        assert response.status_code != 405, f"{method.upper()} {path}"
        if response.status_code == 404:
            assert response.json()["error"]["message"] != "Not Found", f"{method.upper()} {path} is not served"
