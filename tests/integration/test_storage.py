"""Storage behaviour that only PostgreSQL shows."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from kortex.errors import StorageError
from kortex.storage.db import Database

pytestmark = pytest.mark.integration


def test_tool_queries_are_stopped_by_the_database_at_their_timeout(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1, statement_timeout=0.3)
    try:
        with pytest.raises(StorageError), db.connect() as conn:
            conn.execute(text("SELECT pg_sleep(5)"))
        with db.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        db.dispose()
