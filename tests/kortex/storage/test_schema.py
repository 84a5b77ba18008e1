"""The migrations build exactly the schema the code declares."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from kortex.storage.schema import TENANT_TABLES, metadata


def test_migrated_database_matches_the_declared_metadata(sqlite_template: Path) -> None:
    engine = create_engine(f"sqlite:///{sqlite_template}")
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()
    assert diff == [], f"schema.py and the migrations disagree; generate a new revision: {diff}"


def test_every_table_but_tenants_is_tenant_scoped() -> None:
    assert {t.name for t in metadata.sorted_tables} - {t.name for t in TENANT_TABLES} == {"tenants"}
