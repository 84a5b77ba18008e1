"""An upgrade of a SQLite file stopped midway (a Ctrl-C, a failing migration) leaves the file as
it was, so the next start migrates it whole: each CREATE TABLE used to be committed as it ran,
and the tables left without their version failed every later start ("table tenants already
exists")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import alembic.op
import pytest
from sqlalchemy import create_engine, inspect

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
