"""The connection budget: the arithmetic of README "Sizing", and the start-up warning read from
a real PostgreSQL server, which advises and never refuses, holds nothing open, and stays quiet
when it cannot read the server's figures."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from kortex.config import PoolSettings
from kortex.storage.connections import Room, per_process, read_room, shortfall, warn_if_short, worker_processes
from kortex.testing.scratch import throwaway_database

PG_ADMIN = os.environ.get("KORTEX_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
LOGGER = "kortex.storage.connections"
#: The largest pools [pools] allows: 2,000 connections a process.
HUGE = PoolSettings(db_pool_size=500, db_max_overflow=500, telemetry_pool_size=500, telemetry_max_overflow=500)
TOOLS_CHILD = PoolSettings(db_pool_size=1, db_max_overflow=1, telemetry_pool_size=1, telemetry_max_overflow=1)


def test_a_process_opens_its_main_and_telemetry_pools_each_size_plus_overflow() -> None:
    assert per_process(PoolSettings()) == 5 + 5 + 2 + 2  # README's API and turns worker rows
    assert per_process(TOOLS_CHILD) == 4
    assert per_process(HUGE) == 2000


def test_only_prefork_multiplies_a_worker_by_its_concurrency() -> None:
    assert worker_processes("prefork", 8) == 8  # each child builds its own container
    assert worker_processes("threads", 200) == 1
    assert worker_processes("solo", 1) == 1


def test_free_is_what_max_connections_leaves_after_reserved_and_used_never_below_zero() -> None:
    assert Room(max_connections=100, reserved=3, in_use=40).free == 57
    assert Room(max_connections=100, reserved=3, in_use=120).free == 0


def test_a_budget_that_fits_what_is_free_says_nothing() -> None:
    room = Room(max_connections=100, reserved=3, in_use=69)  # 28 free
    assert shortfall(PoolSettings(), 2, room, what="the API", scaled_by="--workers") is None  # 28: exactly fits
    assert shortfall(TOOLS_CHILD, 7, room, what="a worker") is None


def test_a_budget_past_what_is_free_names_the_figures_and_what_to_change() -> None:
    room = Room(max_connections=100, reserved=3, in_use=70)  # 27 free
    message = shortfall(PoolSettings(), 2, room, what="the API", scaled_by="--workers")
    assert message is not None
    assert message.startswith("the API may open up to 28 PostgreSQL connections (2 processes x 14: [pools] "
                              "db_pool_size 5 + db_max_overflow 5 + telemetry_pool_size 2 + "
                              "telemetry_max_overflow 2), more than the 27 the server has free "
                              "(max_connections 100, 3 reserved, 70 in use)")
    assert "too many clients" in message and "KORTEX_POOLS__" in message and " or --workers," in message
    assert "raise PostgreSQL's max_connections" in message

    alone = shortfall(HUGE, 1, room, what="beat")
    assert alone is not None and alone.startswith("beat may open up to 2000 PostgreSQL connections ([pools] ")
    assert "processes x" not in alone and " or --" not in alone  # nothing multiplies beat


def test_sqlite_is_not_checked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path / 'never.db'}"
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert read_room(url) is None
        assert warn_if_short(url, HUGE, 256, what="a worker") is None
    assert not (tmp_path / "never.db").exists()  # never even opened
    assert not caplog.records


def test_a_server_it_cannot_reach_is_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert warn_if_short("postgresql://x@127.0.0.1:9/x", HUGE, 256, what="a worker") is None
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "not checked" in caplog.records[0].getMessage()


# --- against the real server -----------------------------------------------------------------


@pytest.fixture
def database() -> Iterator[tuple[str, str]]:
    with throwaway_database(PG_ADMIN, prefix="kortex_conn") as made:
        yield made


def _admin_figures() -> tuple[int, int]:
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        row = admin.execute("SELECT current_setting('max_connections')::int, "
                            "current_setting('superuser_reserved_connections')::int + "
                            "coalesce(current_setting('reserved_connections', true)::int, 0)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _connections_to(name: str) -> int:
    """Sessions on database ``name`` once the ones just closed have gone (a backend leaves
    pg_stat_activity as it exits, just after its client hung up)."""
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        for _ in range(100):
            row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)).fetchone()
            assert row is not None
            if row[0] == 0:
                break
            time.sleep(0.05)
    return int(row[0])


@pytest.mark.integration
def test_the_figures_are_the_servers_and_the_probe_leaves_no_connection(database: tuple[str, str]) -> None:
    url, name = database
    held = [psycopg.connect(url, connect_timeout=5) for _ in range(3)]
    try:
        room = read_room(url)
    finally:
        for conn in held:
            conn.close()
    assert room is not None
    assert (room.max_connections, room.reserved) == _admin_figures()
    assert room.in_use >= 3  # the three above at least; the probe's own is not counted
    assert _connections_to(name) == 0


@pytest.mark.integration
def test_a_role_without_monitoring_rights_still_counts_other_roles_sessions(database: tuple[str, str]) -> None:
    url, name = database
    role = f"kortex_probe_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        held = [psycopg.connect(url, connect_timeout=5) for _ in range(3)]  # the superuser's
        try:
            room = read_room(make_url(url).set(username=role, password=None).render_as_string(hide_password=False))
        finally:
            for conn in held:
                conn.close()
        assert room is not None and room.in_use >= 3
        assert _connections_to(name) == 0
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')


@pytest.mark.integration
def test_pools_bigger_than_what_is_free_log_one_warning_with_the_numbers(
        database: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    url, name = database
    max_connections, reserved = _admin_figures()
    children = max_connections // per_process(HUGE) + 1  # past the whole server, whatever is in use
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        message = warn_if_short(url, HUGE, children, what="a worker", scaled_by="--concurrency")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].getMessage() == message and message is not None
    total = children * 2000
    assert message.startswith(f"a worker may open up to {total} PostgreSQL connections ({children} processes x 2000: "
                              if children > 1 else f"a worker may open up to {total} PostgreSQL connections ([pools] ")
    assert f"(max_connections {max_connections}, {reserved} reserved, " in message
    assert "db_pool_size 500 + db_max_overflow 500 + telemetry_pool_size 500 + telemetry_max_overflow 500" in message
    assert _connections_to(name) == 0


@pytest.mark.integration
def test_pools_that_fit_say_nothing(database: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    url, _name = database
    smallest = PoolSettings(db_pool_size=1, db_max_overflow=0, telemetry_pool_size=1, telemetry_max_overflow=0)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert warn_if_short(url, smallest, 1, what="beat") is None
    assert not caplog.records
