"""An in-process API client over the test harness, shared by the API tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from tests.conftest import Harness


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def client(harness: Harness) -> Iterator[TestClient]:
    app = create_app(harness.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with TestClient(app) as c:
        yield c
