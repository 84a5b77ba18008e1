"""An upgrade of a SQLite file stopped midway (a Ctrl-C, a failing migration) leaves the file as
it was, so the next start migrates it whole: each CREATE TABLE used to be committed as it ran,
and the tables left without their version failed every later start ("table tenants already
exists")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import alembic.op
import pytest
from sqlalchemy import create_engine, inspect

from kortex.storage.db import Database
from kortex.storage.migrate import upgrade


def _tables(path: Path) -> set[str]:
    engine = create_engine(f"sqlite:///{path}")
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_an_upgrade_that_fails_midway_leaves_the_file_as_it_was_and_the_next_one_completes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kortex.db"
    url = f"sqlite:///{path}"
    original = alembic.op.create_index

    def failing(name: Any, *args: Any, **kwargs: Any) -> Any:
        if "telemetry_logs_ts" in str(name):  # the last migration's first step, after every table exists
            raise KeyboardInterrupt  # as a Ctrl-C lands
        return original(name, *args, **kwargs)

    monkeypatch.setattr(alembic.op, "create_index", failing)
    with pytest.raises(KeyboardInterrupt):
        upgrade(url)
    assert _tables(path) == set()  # nothing of the fourteen migrations before it stayed

    monkeypatch.setattr(alembic.op, "create_index", original)
    upgrade(url)
    assert {"tenants", "turns", "decisions", "alembic_version"} <= _tables(path)


def test_the_database_can_be_opened_and_read_while_a_fresh_file_is_being_upgraded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two embedded commands starting at once: the second opens the file while the first's
    upgrade holds its transaction. The file was still in rollback-journal mode then, and the
    second connection's switch to WAL was refused at once ("database is locked")."""
    path = tmp_path / "kortex.db"
    url = f"sqlite:///{path}"
    original = alembic.op.create_index
    seen: list[Any] = []

    def meanwhile(name: Any, *args: Any, **kwargs: Any) -> Any:
        if "telemetry_logs_ts" in str(name) and not seen:  # mid-upgrade, its transaction open
            other = Database(url)
            try:
                with other.connect() as conn:
                    seen.append(conn.exec_driver_sql("PRAGMA journal_mode").scalar())
            finally:
                other.dispose()
        return original(name, *args, **kwargs)

    monkeypatch.setattr(alembic.op, "create_index", meanwhile)
    upgrade(url)
    assert seen == ["wal"]
    assert "alembic_version" in _tables(path)


def test_two_upgrades_of_a_fresh_file_at_once_both_succeed(tmp_path: Path) -> None:
    """Processes starting together on a new embedded database (alembic runs one upgrade per
    process). The later ones wait for the first's transaction and then find the schema at head
    (a deferred BEGIN read the empty schema first, then could not write: "database is locked")."""
    url = f"sqlite:///{tmp_path / 'kortex.db'}"
    code = "import sys; from kortex.storage.migrate import upgrade; upgrade(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert {"tenants", "turns", "alembic_version"} <= _tables(tmp_path / "kortex.db")
