"""A database a newer Kortex migrated: ``upgrade`` says to upgrade Kortex, in the words
readiness uses (``SchemaState.problem``), instead of Alembic's "Can't locate revision"."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine

from kortex.errors import ConfigError
from kortex.storage.migrate import require_schema, upgrade


def _set_revision(url: str, revision: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = ?", (revision,))
    engine.dispose()


def test_upgrading_a_database_at_an_unknown_revision_says_upgrade_kortex(sqlite_url: str) -> None:
    _set_revision(sqlite_url, "9999")
    with pytest.raises(ConfigError) as raised:
        upgrade(sqlite_url)
    assert "at 9999" in str(raised.value) and "upgrade Kortex" in str(raised.value)
    with pytest.raises(ConfigError) as required:
        require_schema(sqlite_url)
    assert str(required.value) == str(raised.value)  # one message for one state


def test_a_database_behind_is_still_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0012")
    with pytest.raises(ConfigError, match="behind"):
        require_schema(url)
    upgrade(url)
    require_schema(url)  # at head
