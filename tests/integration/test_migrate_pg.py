"""``kortex migrate`` run twice at once on PostgreSQL (two deploys, two pods starting): both
succeed, one after the other, where the second used to fail creating ``alembic_version`` (a
duplicate key in pg_type) on an empty database."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest

from kortex.storage.migrate import MIGRATE_LOCK, require_schema
from kortex.testing.scratch import throwaway_database
from tests.integration.conftest import PG_ADMIN, ROOT

pytestmark = pytest.mark.integration


def _migrate(url: str) -> subprocess.Popen[str]:
    """An upgrade in a process of its own, as ``kortex migrate`` runs it."""
    code = "import sys; from kortex.storage.migrate import upgrade; upgrade(sys.argv[1])"
    return subprocess.Popen([sys.executable, "-c", code, url], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _has_alembic_version(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT to_regclass('alembic_version') IS NOT NULL").fetchone()[0]  # type: ignore[index]


def test_two_migrations_at_once_on_an_empty_database_both_succeed() -> None:
    with throwaway_database(PG_ADMIN, prefix="kortex_migrate") as (url, _):
        runs = [_migrate(url), _migrate(url)]
        outputs = [run.communicate(timeout=120)[0] for run in runs]
        assert [run.returncode for run in runs] == [0, 0], outputs
        require_schema(url)  # at head


def test_a_migration_waits_for_the_one_holding_the_lock_before_reading_the_schema() -> None:
    with throwaway_database(PG_ADMIN, prefix="kortex_migrate") as (url, _):
        with psycopg.connect(url, autocommit=True) as holder:
            holder.execute(f"SELECT pg_advisory_lock({MIGRATE_LOCK})")  # another migrate at work
            run = _migrate(url)
            try:
                time.sleep(3)  # long enough to import and (unlocked) create the whole schema
                assert run.poll() is None, run.communicate()[0]
                assert not _has_alembic_version(url)
            finally:
                holder.execute(f"SELECT pg_advisory_unlock({MIGRATE_LOCK})")
            output = run.communicate(timeout=120)[0]
        assert run.returncode == 0, output
        require_schema(url)


def test_a_migrated_postgresql_database_matches_the_declared_metadata() -> None:
    """tests/kortex/storage/test_schema.py checks SQLite; the migrations take some paths of their own
    on PostgreSQL (its triggers, its partial indexes), so the schema they build is compared there too."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from kortex.storage.db import Database
    from kortex.storage.schema import metadata

    with throwaway_database(PG_ADMIN, prefix="kortex_migrate", migrated=True) as (url, _):
        db = Database(url)
        try:
            with db.engine.connect() as conn:
                diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        finally:
            db.dispose()
    assert diff == [], f"schema.py and the migrations disagree on PostgreSQL: {diff}"
