"""Leader election on PostgreSQL: a session advisory lock on a connection of its own.

The lock lives exactly as long as the connection: a leader that dies (kill -9, a lost host)
drops it with its socket, and the next ``ensure()`` of a waiting process takes it. A paused
leader keeps it, so two never sweep at once; the sweep's writes are compare-and-sets anyway,
so even a stale sweep cannot apply an effect twice. SQLite is one file on one host: every
process there is the leader (the embedded mode runs a single one).
"""

from __future__ import annotations

import logging
import zlib

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from kortex.storage.db import Database

log = logging.getLogger(__name__)


def lock_key(name: str) -> int:
    """A stable advisory lock key for ``name`` (deployments sharing a database use different
    names: their Redis prefix). Below 2**32, so pg_locks shows it as classid 0, objid key."""
    return zlib.crc32(f"kortex-leader:{name}".encode())


class AdvisoryLeader:
    def __init__(self, db: Database, name: str) -> None:
        self.db = db
        self.name = name
        self.key = lock_key(name)
        self._conn: Connection | None = None

    @property
    def leading(self) -> bool:
        return self._conn is not None

    def ensure(self) -> bool:
        """True: this process leads; False: another does. Raises the database's error when it
        could not ask: the caller must not take an unanswered question for a standby's answer
        (``kortex beat --alive-file`` stayed fresh through a database outage)."""
        if self.db.is_sqlite:
            return True
        try:
            if self._conn is not None:
                # Still ours? The server answers for the lock only while our session lives.
                held = self._conn.execute(text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND pid = pg_backend_pid() AND classid::bigint = 0 AND objid::bigint = :k AND objsubid = 1"
                ), {"k": self.key}).scalar()
                if held:
                    return True
                log.warning("watchdog lost the lead (%s)", self.name)
                self._drop()
            conn = self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar())
            except BaseException:
                conn.close()
                raise
            if not got:
                conn.close()
                return False
            self._conn = conn
            log.info("watchdog took the lead (%s)", self.name)
            return True
        except SQLAlchemyError:
            self._drop()  # a lock we may have held ends with its session: ask afresh next time
            raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()  # never back to the pool: the session (and its lock) must end
            except SQLAlchemyError:
                pass

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
            except SQLAlchemyError:
                pass
            self._drop()


__all__ = ["AdvisoryLeader", "lock_key"]
