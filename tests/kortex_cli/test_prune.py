"""``kortex admin prune``: what the retention policy no longer keeps, counted (``--dry-run``) or
deleted now."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from kortex.storage.db import Database
from kortex.storage.schema import telemetry_logs
from kortex_cli.main import app
from tests.kortex.storage.test_retention import OLD, YOUNG, telemetry


def test_admin_prune_counts_with_dry_run_then_deletes_only_what_is_past_its_retention(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    runner = CliRunner()
    assert runner.invoke(app, ["admin", "create-tenant", "acme"], catch_exceptions=False).exit_code == 0
    db = Database(f"sqlite:///{tmp_path / 'data' / 'kortex' / 'kortex.db'}")
    try:
        with db.connect() as conn:
            tenant_id = conn.exec_driver_sql("SELECT id FROM tenants").scalar()
        telemetry(db, tenant_id, OLD["telemetry"], 2)
        telemetry(db, tenant_id, YOUNG["telemetry"])

        def lines() -> int:
            with db.connect() as conn:
                return int(conn.execute(select(func.count()).select_from(telemetry_logs)).scalar() or 0)

        dry = runner.invoke(app, ["admin", "prune", "--dry-run"], catch_exceptions=False)
        assert dry.exit_code == 0, dry.output
        assert "telemetry_logs                2" in dry.output and "decisions                     0" in dry.output
        assert dry.output.strip().endswith("10 rows would be deleted (dry run)") and lines() == 3

        done = runner.invoke(app, ["admin", "prune"], catch_exceptions=False)
        assert done.exit_code == 0 and done.output.strip().endswith("10 rows deleted") and lines() == 1
        again = runner.invoke(app, ["admin", "prune"], catch_exceptions=False)
        assert again.output.strip().endswith("0 rows deleted")
    finally:
        db.dispose()
