"""A model that cannot take a turn is a 422 naming the field ``model``, with the registry's own
code, wherever a model is named: a new session, a message, a retry."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import bearer
from tests.conftest import Harness


def test_an_unknown_model_is_a_422_naming_the_model_field(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    auth = bearer(harness.api_key(tenant))
    turn = harness.ask(tenant, "Why is checkout slow?")
    urls = ("/v1/sessions", f"/v1/sessions/{turn.session_id}/messages", f"/v1/turns/{turn.id}/retry")
    for url in urls:
        for model, code in (("zz:zz", "provider_unavailable"), ("nope", "invalid_input"), (" " * 3, "invalid_input")):
            answer = client.post(url, json={"content": "hi", "model": model} if "messages" in url else {"model": model},
                                 headers=auth)
            assert answer.status_code == 422, (url, answer.text)
            error = answer.json()["error"]
            assert error["code"] == code and error["details"][0]["field"] == "model", (url, error)
    listed = client.get("/v1/sessions", headers=auth).json()["sessions"]
    assert [s["id"] for s in listed] == [turn.session_id]  # and a refused retry left no fork
