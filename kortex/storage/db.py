"""The database engine: PostgreSQL (psycopg 3) or SQLite, one pool per process.

Storage is synchronous on purpose. Workers are Celery processes that run one task at a time, and
every turn transition is a handful of short statements; a blocking driver is about twice as
fast per statement as SQLAlchemy's asyncio bridge (measured: 120 µs against 220 µs on a held
connection), and that difference is most of a turn's cost. The API calls it from its thread
pool; only the streaming paths (LLM calls, SSE) are asynchronous.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, IntegrityError, SQLAlchemyError

from kortex import regex
from kortex.errors import ConfigError, Conflict, StorageError

log = logging.getLogger(__name__)
SQLITE_BUSY_MS = 10_000  # how long a SQLite writer waits for the write lock by default
IDLE_PING_AFTER = 30.0  # seconds a pooled PostgreSQL connection may sit unused before it is checked at checkout

#: the monotonic deadline of the tool call running in this thread: a database with a statement
#: timeout stops its statements there, so a call the pipeline abandoned frees its connection at
#: its own timeout rather than at the longest tool's
_call_deadline: ContextVar[float | None] = ContextVar("kortex_call_deadline", default=None)


@contextmanager
def statements_until(deadline: float | None) -> Iterator[None]:
    token = _call_deadline.set(deadline)
    try:
        yield
    finally:
        _call_deadline.reset(token)


def call_deadline() -> float | None:
    """The monotonic deadline of the tool call running in this thread (``statements_until``), if
    any: what other clients of a tool's upstreams bound their waits by too."""
    return _call_deadline.get()


def _remaining_ms(default_s: float) -> int:
    """Milliseconds a statement may run now: the default, or less when a call's deadline is nearer."""
    seconds = default_s
    deadline = _call_deadline.get()
    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic())
    return max(1, int(seconds * 1000))


def _ping_after_idle(engine: Engine, after: float) -> None:
    """A connection unused for ``after`` seconds answers a ``SELECT 1`` before it is handed out,
    and one that cannot is replaced by a fresh one (the statement never sees it). The pool hands
    out the connection used last (``pool_use_lifo``), so under light load the ones below it can
    sit unused for long: an idle timeout (the server's, a proxy's, a NAT's) may have closed them
    by the time a burst reaches them. Busy connections are never pinged."""

    def checkin(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < after:
            return
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("SELECT 1")
            finally:
                cursor.close()
            if not dbapi_connection.autocommit:
                dbapi_connection.rollback()  # the ping's implicit transaction: the caller begins its own
        except Exception as exc:
            raise DisconnectionError(f"an idle pooled connection is gone ({exc.__class__.__name__})") from exc

    event.listen(engine, "checkin", checkin)
    event.listen(engine, "checkout", checkout)


def _pg_statement_timeout(engine: Engine, seconds: float) -> None:
    """The connection's statement timeout is the default; a statement run for a tool call with a
    nearer deadline lowers it first (one SET, only when the value changes), and the next
    statement on the connection that has no such deadline raises it back the same way.

    Not reset when the connection returns to the pool: every statement on this engine passes
    here first, and the reset at check-in cost three round trips per tool call (BEGIN, SET,
    COMMIT) where the next statement needs at most one. Tool queries run in autocommit; a
    statement inside a transaction sets its timeout with SET LOCAL, each time."""
    default_ms = int(seconds * 1000)

    def before(conn: Connection, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        info = conn.connection.info  # the pool entry's: it outlives one checkout
        wanted = _remaining_ms(seconds)
        if not getattr(conn.connection.dbapi_connection, "autocommit", True):
            # In a transaction a SET is undone by a rollback, and the record below would then
            # be wrong: set it for this transaction only, and record nothing.
            cursor.execute(f"SET LOCAL statement_timeout = {wanted}")
            return
        # Within 50 ms of the current value is close enough: no round trip for every statement.
        if abs(wanted - info.get("statement_ms", default_ms)) > 50 or wanted < 50:
            cursor.execute(f"SET statement_timeout = {wanted}")
            info["statement_ms"] = wanted

    event.listen(engine, "before_cursor_execute", before)


def _normalise(url: str | URL) -> URL:
    if isinstance(url, str):
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError):  # its text quotes the URL, password and all (a bad port: ValueError)
            raise ConfigError("the database URL is not a URL: use postgresql://user@host/db or sqlite:///path") from None
    else:
        parsed = url
    if parsed.drivername == "postgres" or parsed.drivername.startswith("postgres+"):
        # What Heroku, libpq and most PostgreSQL tools write; SQLAlchemy only knows postgresql.
        parsed = parsed.set(drivername="postgresql" + parsed.drivername[len("postgres"):])
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "sqlite"):
        raise ConfigError(f"unsupported database {backend!r}: use postgresql:// or sqlite://")
    return parsed


def sync_url(url: str | URL) -> URL:
    parsed = _normalise(url)
    if parsed.get_backend_name() == "postgresql":
        return parsed.set(drivername="postgresql+psycopg")
    return parsed.set(drivername="sqlite")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers proceed while one thread writes; busy_timeout waits for the write lock
    # instead of failing at once. (Every write transaction here starts with its write, so the
    # driver's deferred BEGIN never has to upgrade a read lock.)
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")  # first: the switch to WAL may wait too
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
    # User-written regexes (LogQL |~) run on RE2, never on Python's backtracking engine.
    dbapi_connection.create_function(regex.SQLITE_FUNCTION, 2, regex.sqlite_search, deterministic=True)
    # Text in any case beyond ASCII (SQLite's LIKE and lower() fold ASCII only).
    dbapi_connection.create_function(regex.SQLITE_ICONTAINS, 2, regex.sqlite_icontains, deterministic=True)


def _sqlite_statement_timeout(engine: Engine, seconds: float) -> None:
    """SQLite has no statement timeout: a progress handler interrupts a statement past its
    deadline (the driver then raises OperationalError, 'interrupted')."""

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        def check() -> int:
            deadline = record.info.get("deadline")
            return 1 if deadline is not None and time.monotonic() > deadline else 0

        dbapi_connection.set_progress_handler(check, 10_000)

    def before(conn: Connection, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        info = conn.connection.info  # the pool entry's, which check above reads as record.info
        info["deadline"] = time.monotonic() + _remaining_ms(seconds) / 1000

    event.listen(engine, "connect", on_connect)
    event.listen(engine, "before_cursor_execute", before)


@contextmanager
def _translated() -> Iterator[None]:
    """SQLAlchemy errors become the error tree; constraint violations become Conflict, because
    unique constraints carry our idempotency rules and callers catch them."""
    try:
        yield
    except IntegrityError as exc:
        raise Conflict("the change violates a database constraint", code="integrity") from exc
    except SQLAlchemyError as exc:
        raise StorageError(f"database error: {exc.__class__.__name__}") from exc


@contextmanager
def bounded_writes(conn: Connection, seconds: float | None) -> Iterator[None]:
    """Inside a transaction: wait at most ``seconds`` for locks (SQLite's busy handler,
    PostgreSQL's lock and statement timeouts) instead of the connection's default."""
    if seconds is None:
        yield
        return
    ms = max(1, int(seconds * 1000))
    if conn.dialect.name == "postgresql":  # SET LOCAL ends with the transaction
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {ms}")
        yield
        return
    conn.exec_driver_sql(f"PRAGMA busy_timeout = {ms}")
    try:
        yield
    finally:  # the connection goes back to the pool: restore the default wait
        conn.exec_driver_sql(f"PRAGMA busy_timeout = {SQLITE_BUSY_MS}")


class Database:
    """The application's handle on the database. One per process; safe to share between threads."""

    def __init__(self, url: str, *, pool_size: int = 10, max_overflow: int | None = None, echo: bool = False,
                 statement_timeout: float | None = None, pool_timeout: float = 30.0,
                 idle_ping_after: float = IDLE_PING_AFTER) -> None:
        """``statement_timeout`` (seconds) makes the database itself stop longer statements:
        tool queries get one, so a call the pipeline gave up on does not hold a connection."""
        self.url = _normalise(url)
        self.dialect = self.url.get_backend_name()
        overflow = pool_size * 2 if max_overflow is None else max_overflow
        if self.dialect != "postgresql":
            overflow = pool_size
        #: the most connections this handle opens at once (pool + overflow)
        self.max_connections = pool_size + overflow
        # Bound parameters carry user content and tool output: keep them out of error messages.
        kwargs: dict[str, Any] = {"echo": echo, "hide_parameters": True}
        if self.dialect == "postgresql":
            # Every connection up to the budget is kept once opened: an overflow connection is
            # closed when returned while the pool holds pool_size idle ones, and a busy process
            # (step work comes in bursts) then reconnected ~300 times in 400 turns, each a new
            # backend forked by PostgreSQL. The pool still opens them only when needed.
            # Last in, first out: the connection used last is the next one out, its backend
            # still warm in the CPU's caches. Taken in turn (the default), each statement of a
            # lone POST went to the backend idle longest: 1.0-1.4 ms each in the API where
            # LIFO measured 0.8-1.1 (latency bench, sequential posts). The ones below the top
            # may then sit unused for long: they are checked before reuse (_ping_after_idle).
            kwargs.update(pool_size=pool_size + overflow, max_overflow=0, pool_use_lifo=True,
                          pool_pre_ping=False, pool_recycle=1800, pool_timeout=pool_timeout)
            if statement_timeout:
                kwargs["connect_args"] = {"options": f"-c statement_timeout={int(statement_timeout * 1000)}"}
        else:
            database = self.url.database
            if database and database != ":memory:":
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            kwargs.update(connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_MS / 1000},
                          pool_size=pool_size,
                          max_overflow=overflow)
        self.engine: Engine = create_engine(sync_url(self.url), **kwargs)
        # Reads run in autocommit: one round trip per statement, no BEGIN/ROLLBACK around them.
        self._reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            if statement_timeout:
                _sqlite_statement_timeout(self.engine, statement_timeout)
        else:
            _ping_after_idle(self.engine, idle_ping_after)
            if statement_timeout:
                _pg_statement_timeout(self.engine, statement_timeout)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A connection inside one transaction, committed on success, rolled back on error."""
        with _translated(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """An autocommit connection: every statement is its own transaction. For reads and for
        single-statement compare-and-set transitions."""
        with _translated(), self._reader.connect() as conn:
            yield conn

    def ping(self) -> None:
        with self.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()
