"""Apply the Alembic migrations shipped inside the package."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, pool
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from kortex.errors import ConfigError
from kortex.storage.db import SQLITE_BUSY_MS, sync_url

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
#: the PostgreSQL advisory lock key ``upgrade`` holds ("kortex" in ASCII): one upgrade at a time
MIGRATE_LOCK = 0x6B6F72746578


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", sync_url(url).render_as_string(hide_password=False))
    return cfg


def upgrade(url: str, revision: str = "head") -> SchemaState:
    """Bring the database at ``url`` to ``revision``. Safe to call on every start. Returns where
    the schema stood before (``current``: None for a database that had none) and the head."""
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    if engine.dialect.name == "sqlite":
        database = engine.url.database
        if database and database != ":memory:":
            if revision == "head" and Path(database).exists():
                # Every embedded command opens the file so: one read answers it, without the
                # write lock the upgrade takes below (a start would wait on any writer).
                try:
                    with engine.connect() as conn:
                        state = schema_state(conn)
                    if state.at_head:
                        return state
                finally:
                    engine.dispose()
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        _transactional_ddl(engine)
    try:
        with engine.connect() as conn:
            locked = engine.dialect.name == "postgresql"
            if locked:
                # Two `kortex migrate` at once (two deploys, two pods starting) must not both
                # find the schema behind and both apply it: on an empty database the loser
                # failed creating alembic_version (a duplicate key in pg_type). The second waits
                # here, then reads the schema the first left. A session lock, not a transaction
                # one, so it lasts for the whole upgrade whatever the migrations commit.
                conn.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATE_LOCK})")
                conn.commit()
            try:
                with conn.begin():
                    state = schema_state(conn)
                    if state.current is not None and not _known(state.current):
                        # Alembic would only say "Can't locate revision identified by ..."
                        raise ConfigError(state.problem() or "")
                    cfg = alembic_config(url)
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, revision)
                    return state
            finally:
                if locked:
                    try:
                        conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATE_LOCK})")
                        conn.commit()
                    except DBAPIError:  # a broken connection: closing it (NullPool) frees the lock
                        log.warning("could not release the migration lock; it goes with the connection",
                                    exc_info=True)
    finally:
        engine.dispose()


def _transactional_ddl(engine: Engine) -> None:
    """The whole upgrade in one SQLite transaction, DDL included: the driver opens a transaction
    only before an INSERT, UPDATE or DELETE, so each CREATE TABLE was committed as it ran, and an
    upgrade stopped midway (a Ctrl-C, a failing migration) left tables without the version that
    made them: every later start failed with "table tenants already exists". SQLite itself rolls
    DDL back; the driver is told to keep out of it (SQLAlchemy's documented pysqlite recipe)."""

    @event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        # WAL before the transaction opens: a fresh file is still in rollback-journal mode, and
        # another process or thread opening it meanwhile (two embedded commands starting at
        # once) switches it to WAL as it connects, which SQLite refuses at once, with no busy
        # wait, while this upgrade holds its lock ("database is locked"). In WAL mode already,
        # that switch is a no-op and readers proceed beside the upgrade.
        dbapi_connection.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        dbapi_connection.execute("PRAGMA journal_mode=WAL")

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # IMMEDIATE: the write lock before the schema is read, so a second upgrade starting
        # beside this one waits for it and then finds the schema at head (a deferred BEGIN read
        # the old schema, and then could not write over the first's commit).
        conn.exec_driver_sql("BEGIN IMMEDIATE")


@dataclass(frozen=True, slots=True)
class SchemaState:
    """Where a database's schema stands against the migrations this code ships."""

    current: str | None  # None: never migrated
    head: str

    @property
    def at_head(self) -> bool:
        return self.current == self.head

    def problem(self) -> str | None:
        """What an operator must do before this code may use the database, or None."""
        if self.current is None:
            return "the database has no Kortex schema: run 'kortex migrate'"
        if self.at_head:
            return None
        if _known(self.current):
            return f"the database schema is at {self.current}, behind {self.head}: run 'kortex migrate'"
        return (f"the database schema is at {self.current}, which this version of Kortex does not know "
                "(a newer release migrated it): upgrade Kortex")


@functools.cache  # the shipped migrations do not change while a process runs
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def _known(revision: str) -> bool:
    return revision in {rev.revision for rev in _script().walk_revisions()}


def schema_state(conn: Connection) -> SchemaState:
    """Read, never write: safe for readiness probes on every process."""
    return SchemaState(current=MigrationContext.configure(conn).get_current_revision(),
                       head=_script().get_current_head() or "")


def prepare(url: str) -> None:
    """The schema a command about to use the database at ``url`` needs. A SQLite file is this
    machine's own: it is created or upgraded as it is opened. A PostgreSQL database is shared by
    a fleet and changes only by ``kortex migrate``: a newer command line must not move its
    schema under older running processes, so one that is behind is refused (ConfigError)."""
    if sync_url(url).get_backend_name() == "sqlite":
        upgrade(url)
    else:
        require_schema(url)


def require_schema(url: str) -> None:
    """Refuse to start a process on a database it cannot use (ConfigError, one line)."""
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            problem = schema_state(conn).problem()
    finally:
        engine.dispose()
    if problem:
        raise ConfigError(problem)
