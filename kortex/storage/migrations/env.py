"""Alembic environment: runs migrations on the sync engine of the configured database."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from kortex.storage.db import sync_url
from kortex.storage.schema import metadata

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(sync_url(config.get_main_option("sqlalchemy.url")), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
