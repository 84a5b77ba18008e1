"""The command line in the embedded mode: the demo and tenant administration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kortex_cli.main import app


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "kortex"


def test_demo_streams_an_answer_naming_the_deploy_and_the_pool_errors(home: Path) -> None:
    result = CliRunner().invoke(app, ["demo"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "mode: embedded" in out and (home / "kortex.db").is_file()
    for tool in ("get_recent_deploys", "compare_to_baseline", "get_logs", "get_incident_history", "propose_action"):
        assert f"→ {tool}" in out and f"✓ {tool}" in out
    assert "⚑ proposal" in out and "awaits a human" in out
    assert "Offline analyst (rule-based, no LLM)" in out
    assert "v2.14.0" in out and "connection pool exhausted" in out
    assert out.index("→ get_logs") < out.index("✓ get_logs") < out.index("Summary")
    assert "· done" in out


def test_create_tenant_prints_a_working_key_once(home: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["admin", "create-tenant", "acme"], catch_exceptions=False)
    assert first.exit_code == 0
    key = first.output.strip().splitlines()[-1]
    assert re.fullmatch(r"kx_[0-9a-f]{12}_[A-Za-z0-9]{20,}", key)
    db = (home / "kortex.db").read_bytes()
    assert key.encode() not in db and key.split("_")[2].encode() not in db  # only a hash is stored
    again = runner.invoke(app, ["admin", "create-tenant", "acme"])
    assert again.exit_code == 1 and "already exists" in again.output
    more = runner.invoke(app, ["admin", "create-key", "acme"])
    assert more.exit_code == 0 and more.output.strip() != key


def test_worker_refuses_to_start_without_redis(home: Path) -> None:
    result = CliRunner().invoke(app, ["worker"])
    assert result.exit_code == 1 and "KORTEX_REDIS_URL" in result.output
