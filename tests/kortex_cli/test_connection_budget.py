"""``kortex api``, ``kortex worker`` and ``kortex beat`` warn at start when their pools could
take more PostgreSQL connections than the server has free, counting what the command starts
(uvicorn processes, prefork children), and start anyway."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from kortex.testing.scratch import throwaway_database

PG_ADMIN = os.environ.get("KORTEX_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("KORTEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
#: The largest pools [pools] allows: 2,000 PostgreSQL connections a process.
HUGE_POOLS = {"KORTEX_POOLS__DB_POOL_SIZE": "500", "KORTEX_POOLS__DB_MAX_OVERFLOW": "500",
              "KORTEX_POOLS__TELEMETRY_POOL_SIZE": "500", "KORTEX_POOLS__TELEMETRY_MAX_OVERFLOW": "500"}

pytestmark = pytest.mark.integration


@pytest.fixture
def distributed(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A migrated database of its own and the real Redis; the server's max_connections."""
    with throwaway_database(PG_ADMIN, prefix="kortex_budget", migrated=True) as (url, _name):
        monkeypatch.setenv("KORTEX_DATABASE_URL", url)
        monkeypatch.setenv("KORTEX_REDIS_URL", REDIS_URL)
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
            row = admin.execute("SELECT current_setting('max_connections')::int").fetchone()
        assert row is not None
        yield int(row[0])


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kortex.storage.connections" and r.levelno >= logging.WARNING]


def _invoke(args: list[str], caplog: pytest.LogCaptureFixture) -> Any:
    from kortex_cli import main

    with caplog.at_level(logging.INFO, logger="kortex.storage.connections"):
        return CliRunner().invoke(main.app, args)


def test_the_api_counts_every_uvicorn_process_and_still_starts(
        distributed: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from kortex_cli import main

    served: list[Any] = []
    monkeypatch.setattr(main, "_serve", served.append)
    monkeypatch.setattr(main, "_metrics_multiprocess", lambda service: None)
    for name, value in HUGE_POOLS.items():
        monkeypatch.setenv(name, value)
    result = _invoke(["api", "--port", "8999", "--workers", "3"], caplog)
    assert result.exit_code == 0, result.output
    assert len(served) == 1 and served[0].workers == 3  # a warning, not a refusal
    [line] = _warnings(caplog)
    assert line.startswith("the API may open up to 6000 PostgreSQL connections (3 processes x 2000: [pools] ")
    assert f"(max_connections {distributed}, " in line and "Lower [pools] (KORTEX_POOLS__*) or --workers," in line


def test_a_prefork_worker_counts_its_children(
        distributed: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import workers.app

    started: list[list[str]] = []
    monkeypatch.setattr(workers.app.app, "worker_main", started.append)
    for name, value in HUGE_POOLS.items():
        monkeypatch.setenv(name, value)
    result = _invoke(["worker", "--queues", "tools", "--pool", "prefork", "--concurrency", "4", "--task-logs"],
                     caplog)
    assert result.exit_code == 0, result.output
    assert len(started) == 1 and started[0][started[0].index("-c") + 1] == "4"
    [line] = _warnings(caplog)
    assert line.startswith("a worker may open up to 8000 PostgreSQL connections (4 processes x 2000: ")
    assert "or --concurrency," in line


def test_a_threads_worker_is_one_pool_set_whatever_its_concurrency(
        distributed: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import workers.app

    monkeypatch.setattr(workers.app.app, "worker_main", lambda argv: None)
    # The compose file's tools child (4 connections): 200 threads share them, so it fits.
    for name in ("DB_POOL_SIZE", "DB_MAX_OVERFLOW", "TELEMETRY_POOL_SIZE", "TELEMETRY_MAX_OVERFLOW"):
        monkeypatch.setenv(f"KORTEX_POOLS__{name}", "1")
    result = _invoke(["worker", "--queues", "tools", "--concurrency", "200", "--task-logs"], caplog)
    assert result.exit_code == 0, result.output
    assert _warnings(caplog) == []
    assert not any(r.levelno >= logging.WARNING for r in caplog.records if r.name.startswith("kortex"))


def test_beat_warns_for_its_one_process(
        distributed: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    if distributed >= 2000:
        pytest.skip("this server has room for 2,000 more connections")
    ran: list[Any] = []
    monkeypatch.setattr("workers.beat.run", lambda settings, **kwargs: ran.append(settings))
    for name, value in HUGE_POOLS.items():
        monkeypatch.setenv(name, value)
    root = logging.getLogger()
    level = root.level
    try:
        result = _invoke(["beat"], caplog)
    finally:
        root.setLevel(level)  # beat sets its --loglevel on the root logger
    assert result.exit_code == 0, result.output
    assert len(ran) == 1
    [line] = _warnings(caplog)
    assert line.startswith("beat may open up to 2000 PostgreSQL connections ([pools] db_pool_size 500 + ")
    assert "or --" not in line
