"""``model: "auto"`` with no model to route to is refused when posted (422 ``no_route``), as a
pinned model that cannot answer is, not accepted and then failed by its first step."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from api.main import create_app
from tests.api.conftest import bearer
from tests.conftest import Harness


def test_auto_with_nothing_to_route_to_is_a_422_no_route(harness_factory: Any) -> None:
    # The candidates are OpenAI's models, and OpenAI has no key here: nothing can be routed to.
    h: Harness = harness_factory(llm={"providers": {"openai": {"api_key": "${OPENAI_API_KEY}"}},
                                      "routing": {"candidates": ["openai::gpt-4o-mini", "openai::gpt-4o"]}})
    tenant = h.tenant("acme")
    auth = bearer(h.api_key(tenant))
    sent: list[Any] = []
    with TestClient(create_app(h.settings, dispatch=sent.append, embedded_worker=False)) as api:
        session = api.post("/v1/sessions", json={"name": "x"}, headers=auth).json()["id"]
        for url, body in ((f"/v1/sessions/{session}/messages", {"content": "Is checkout up?", "model": "auto"}),
                          ("/v1/sessions", {"name": "routed", "model": "auto"})):
            got = api.post(url, json=body, headers=auth)
            assert got.status_code == 422, got.text
            error = got.json()["error"]
            assert error["code"] == "no_route" and error["details"][0]["field"] == "model"
        assert sent == []  # nothing was queued


def test_auto_with_a_model_to_route_to_is_accepted(client: TestClient, harness: Harness) -> None:
    auth = bearer(harness.api_key(harness.tenant("acme")))  # the default: the offline analyst answers
    assert client.post("/v1/sessions", json={"name": "routed", "model": "auto"}, headers=auth).status_code == 201
