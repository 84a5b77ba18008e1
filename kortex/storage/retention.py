"""Deleting rows past their retention (``[retention]``, README "Retention"): a batch is the oldest
rows of one table, of every tenant at once where the table has an index on its time alone, else
of one tenant, in a short transaction of its own; tables and tenants take turns, so one large
backlog does not hold the others back.

A global housekeeping job, the one place that works across tenants; its statements still name
their columns. Chat sessions, turns and messages, proposals, incidents, post-mortem documents and
active API keys are not here on purpose (README "Retention").
"""

from __future__ import annotations

import sqlite3
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Column, ColumnElement, Select, Table, delete, func, select, text
from sqlalchemy.engine import Connection

from kortex.config_retention import RetentionSettings
from kortex.errors import StorageError
from kortex.storage.db import Database, bounded_writes
from kortex.storage.postmortems import OPEN
from kortex.storage.schema import (
    api_keys,
    decisions,
    llm_requests,
    postmortem_events,
    postmortem_items,
    postmortem_jobs,
    telemetry_deploys,
    telemetry_logs,
    telemetry_metrics,
    telemetry_spans,
    tenants,
)

Policy = Literal["telemetry", "audit", "postmortem", "revoked_keys"]

#: the statuses a job ends in (kortex/postmortems/jobs.py)
JOB_ENDED = ("cancelled", "done", "failed")
#: jobs weighed per batch: their ids are bound one by one, and their rows are counted first
JOBS_PER_BATCH = 100
#: the longest one batch may wait for a lock or run when the run itself has no time bound
MAX_BATCH_SECONDS = 30.0
#: the SQLite trigger that refuses a DELETE on the audit trail (migration 0001)
AUDIT_GUARD = "decisions_no_delete"

_jobs, _items = postmortem_jobs.c, postmortem_items.c


@dataclass(frozen=True, slots=True)
class Target:
    """A table pruned by age, the oldest rows first: ``age`` alone is indexed (migrations 0015,
    0016), or ``per_tenant``, where ``(tenant_id, age)`` leads an index
    (``telemetry_deploys``: ``(tenant_id, product, ts)``, a few rows a day) and a tenant's oldest
    rows are one index range. A row whose ``age`` is NULL is never older than a cutoff."""

    table: Table
    age: str
    policy: Policy
    per_tenant: bool = True
    only: tuple[ColumnElement[bool], ...] = ()  # what else a row must be to go
    children: tuple[Column[str], ...] = ()       # foreign keys that delete their rows with it (CASCADE)


TARGETS: tuple[Target, ...] = (
    # Indexes of their own on the time (not (tenant_id, time)): a log query for one trace on SQLite
    # preferred (tenant_id, ts) to its (tenant_id, trace_id) index, reading the tenant's whole window.
    Target(telemetry_logs, "ts", "telemetry", per_tenant=False),
    Target(telemetry_metrics, "ts", "telemetry", per_tenant=False),
    Target(telemetry_spans, "start_ts", "telemetry", per_tenant=False),
    Target(telemetry_deploys, "ts", "telemetry"),
    Target(llm_requests, "created_at", "telemetry"),
    Target(decisions, "created_at", "audit"),
    # Revoked API keys (an active key's revoked_at is NULL: never chosen), every tenant's at once
    # through their index on revoked_at (migration 0016). Deleting one is safe for
    # authentication: a key that is not there is refused as a revoked one is (storage/tenants.py
    # authenticate, valid_key_ids; a new key that drew its id has a secret of its own), every API
    # process forgot it long ago (at its revocation, or its cache's TTL after), and the embedded
    # mode's revocation epoch cannot be held still by the deletion (kortex/keys.py
    # revocation_epoch). Its audit rows stay.
    Target(api_keys, "revoked_at", "revoked_keys", per_tenant=False),
    # A job that is over, none of whose items still runs (cancel with running=finish lets them).
    Target(postmortem_jobs, "created_at", "postmortem",
           only=(_jobs.status.in_(JOB_ENDED),
                 ~select(_items.id).where(_items.job_id == _jobs.id, _items.status.in_(OPEN))
                 .correlate(postmortem_jobs).exists()),
           children=(postmortem_items.c.job_id, postmortem_events.c.job_id)),
)

#: every table a run reports on, cascaded children included, in the order they are reported
TABLES: tuple[str, ...] = tuple(name for t in TARGETS for name in (t.table.name, *(c.table.name for c in t.children)))


@dataclass(frozen=True, slots=True)
class PruneReport:
    rows: dict[str, int]  # table -> rows deleted (with dry_run: rows that would be)
    finished: bool = True  # False: the run's time bound stopped it with rows left
    dry_run: bool = False
    # Where the next run should start (``prune(start=)``): at the first table and tenant this one
    # did not reach, so tenants late in the order are not left waiting behind the early ones.
    resume: int = 0

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def cutoffs(policy: RetentionSettings, now: datetime) -> dict[Policy, datetime]:
    """What each policy that is not off deletes: rows older than this."""
    days: dict[Policy, int | None] = {"telemetry": policy.telemetry_days, "audit": policy.audit_days,
                                      "postmortem": policy.postmortem_days,
                                      "revoked_keys": policy.revoked_keys_days}
    return {name: now - timedelta(days=n) for name, n in days.items() if n is not None}


def prune(db: Database, policy: RetentionSettings, *, now: datetime, dry_run: bool = False,
          until_done: bool = False, start: int = 0, clock: Callable[[], float] = time.monotonic) -> PruneReport:
    """Delete every row older than its policy's cutoff, or count them (``dry_run``). No batch
    starts after ``policy.run_seconds``, and none runs past it; ``until_done`` (an operator's
    ``kortex admin prune``) goes on until none is left. ``start``: the last run's ``resume``."""
    before = cutoffs(policy, now)
    targets = [t for t in TARGETS if t.policy in before]
    rows = dict.fromkeys(TABLES, 0)
    if not targets:
        return PruneReport(rows, dry_run=dry_run)
    with db.connect() as conn:
        tenant_ids = list(conn.execute(select(tenants.c.id).order_by(tenants.c.id)).scalars())
    pairs = [(target, tenant_id) for target in targets
             for tenant_id in (tenant_ids if target.per_tenant else [None])]
    if dry_run:
        with db.connect() as conn:
            for target, tenant_id in pairs:
                _add(rows, _count(conn, target, tenant_id, before[target.policy]))
        return PruneReport(rows, dry_run=True)
    deadline = None if until_done else clock() + policy.run_seconds
    start = start % len(pairs) if pairs else 0
    work = deque((*pair, True) for pair in pairs[start:] + pairs[:start])
    reached = 0  # pairs that had their first batch: the first of the line, in order
    while work:
        left = MAX_BATCH_SECONDS if deadline is None else min(deadline - clock(), MAX_BATCH_SECONDS)
        if left <= 0:
            break
        target, tenant_id, first = work.popleft()
        try:
            deleted, more = _batch(db, target, tenant_id, before[target.policy], policy.batch_rows, left)
        except StorageError as exc:
            if not _out_of_time(exc):
                raise
            break  # a lock or a statement outlasted the run: the next run goes on from this pair
        reached += first
        _add(rows, deleted)
        if more:  # to the back of the line: the other tenants and tables go first
            work.append((target, tenant_id, False))
    else:
        return PruneReport(rows)
    return PruneReport(rows, finished=False, resume=(start + reached) % len(pairs))


def _add(rows: dict[str, int], more: dict[str, int]) -> None:
    for name, n in more.items():
        rows[name] += n


def _old(target: Target, tenant_id: str | None, cutoff: datetime) -> list[ColumnElement[bool]]:
    table = target.table
    tenant = [table.c.tenant_id == tenant_id] if tenant_id is not None else []
    return [*tenant, table.c[target.age] < cutoff, *target.only]


def _count(conn: Connection, target: Target, tenant_id: str | None, cutoff: datetime) -> dict[str, int]:
    table = target.table
    chosen = select(table.c.id).where(*_old(target, tenant_id, cutoff))
    found = {table.name: int(conn.execute(select(func.count()).select_from(chosen.subquery())).scalar() or 0)}
    for fk in target.children:
        found[fk.table.name] = int(conn.execute(select(func.count()).where(fk.in_(chosen))).scalar() or 0)
    return found


def _batch(db: Database, target: Target, tenant_id: str | None, cutoff: datetime, limit: int,
           seconds: float) -> tuple[dict[str, int], bool]:
    """One transaction: at most ``limit`` of the table's oldest rows (of one tenant, unless None; a
    parent counts with the rows it takes along). True with them: there may be more."""
    table = target.table
    oldest = select(table.c.id).where(*_old(target, tenant_id, cutoff)).order_by(table.c[target.age])
    with db.begin() as conn, bounded_writes(conn, seconds):
        if target.children:
            return _parents(conn, target, oldest, limit)
        guard = _lift_audit_guard(conn, cutoff) if table is decisions else None
        deleted = conn.execute(delete(table).where(_among(conn, table, oldest.limit(limit)))).rowcount
        if guard:
            conn.exec_driver_sql(guard)  # SQLite's trigger, as it was, before the transaction commits
    return {table.name: deleted}, deleted >= limit


def _among(conn: Connection, table: Table, chosen: Select[Any]) -> ColumnElement[bool]:
    """``id`` is one of ``chosen``. PostgreSQL's planner would join ``IN (subquery)`` by hashing the
    whole table (a scan of every row for each batch); ``= ANY(ARRAY(subquery))`` reads the batch's
    ids first and looks each one up by the primary key."""
    if conn.dialect.name == "postgresql":
        return table.c.id == func.any(func.array(chosen.scalar_subquery()))
    return table.c.id.in_(chosen.scalar_subquery())


def _parents(conn: Connection, target: Target, oldest: Select[Any], limit: int) -> tuple[dict[str, int], bool]:
    """Parents whose rows and children's rows together stay within ``limit`` (one at least, as
    large as it is: a job has at most 1,000 items), deleted with their children by the foreign
    keys' cascade, each table counted first."""
    table = target.table
    ids = list(conn.execute(oldest.limit(JOBS_PER_BATCH)).scalars())
    if not ids:
        return {}, False
    sizes = {job: {fk.table.name: 0 for fk in target.children} for job in ids}
    for fk in target.children:
        for job, n in conn.execute(select(fk, func.count()).where(fk.in_(ids)).group_by(fk)):
            sizes[job][fk.table.name] = n
    taken: list[str] = []
    total = 0
    for job in ids:
        size = 1 + sum(sizes[job].values())
        if taken and total + size > limit:
            break
        taken.append(job)
        total += size
    deleted = conn.execute(delete(table).where(table.c.id.in_(taken))).rowcount
    counts = {table.name: deleted}
    for fk in target.children:
        counts[fk.table.name] = sum(sizes[job][fk.table.name] for job in taken)
    return counts, len(taken) < len(ids) or len(ids) == JOBS_PER_BATCH


def _lift_audit_guard(conn: Connection, cutoff: datetime) -> str | None:
    """The audit trail refuses DELETE at the database (migration 0001). PostgreSQL's trigger lets
    this transaction delete rows older than the cutoff it names (migration 0015), nothing newer;
    SQLite's trigger is dropped here and recreated before commit, in this transaction: SQLite has
    one writer, so no other connection can delete meanwhile, and a failure restores it. Returns
    the dropped trigger's SQL, to be run again before the transaction commits."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT set_config('kortex.prune_audit_before', :cutoff, true)"),
                     {"cutoff": cutoff.isoformat()})
        return None
    raw = conn.connection.dbapi_connection
    if raw is not None and not raw.in_transaction:
        # The driver begins a transaction only at a DML statement: a DROP before it would commit at once.
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    guard = conn.execute(text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = :name"),
                         {"name": AUDIT_GUARD}).scalar()
    if guard:
        conn.exec_driver_sql(f"DROP TRIGGER {AUDIT_GUARD}")
    return str(guard) if guard else None


def _out_of_time(exc: BaseException) -> bool:
    """A statement cancelled by the batch's statement or lock timeout (PostgreSQL), or SQLite's
    write lock not had in time."""
    cause = getattr(exc.__cause__, "orig", None)
    if getattr(cause, "sqlstate", None) in ("57014", "55P03"):  # query_canceled, lock_not_available
        return True
    return isinstance(cause, sqlite3.OperationalError) and "locked" in str(cause)


__all__ = ["TABLES", "TARGETS", "PruneReport", "cutoffs", "prune"]
