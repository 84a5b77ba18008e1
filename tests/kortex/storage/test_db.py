"""Database URLs: what a user may write, and what a mistake says."""

from __future__ import annotations

import pytest

from kortex.errors import ConfigError
from kortex.storage.db import sync_url


@pytest.mark.parametrize(("written", "driver"), [
    ("postgresql://u@db.internal:5432/kortex", "postgresql+psycopg"),
    ("postgres://u@db.internal:5432/kortex", "postgresql+psycopg"),  # libpq's, Heroku's
    ("postgres+psycopg://u@db.internal/kortex", "postgresql+psycopg"),
    ("sqlite:///var/kortex.db", "sqlite"),
])
def test_postgres_and_postgresql_urls_both_reach_psycopg(written: str, driver: str) -> None:
    url = sync_url(written)
    assert url.drivername == driver and url.database in ("kortex", "var/kortex.db")


@pytest.mark.parametrize(("written", "says"), [
    ("db.internal:5432/kortex", "not a URL"),
    ("mysql://u:hunter2@db/kortex", "unsupported database 'mysql'"),
    ("postgresql://u:hunter2@db:notaport/kortex", "not a URL"),
])
def test_a_bad_url_is_a_one_line_config_error_without_its_password(written: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        sync_url(written)
    assert says in str(caught.value) and "hunter2" not in str(caught.value)
    assert caught.value.__cause__ is None or "hunter2" not in str(caught.value.__cause__)
