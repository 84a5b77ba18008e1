"""Post-mortem jobs, their items and the documents they produce. Every query is scoped to a
tenant, except the watchdog's sweeps, which hand back rows that carry their tenant.

Item status moves by compare-and-set only (``queued -> dispatched -> running -> done | failed |
skipped | cancelled``), so a duplicate task, a re-delivered hook or a racing cancel finds the
item moved on and does nothing; and ``postmortems.item_id`` is unique, so one item never has
two documents whatever runs twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, exists, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from kortex.errors import NotFound
from kortex.storage import tenants as tenant_store
from kortex.storage.records import ItemRecord, JobRecord, PostmortemRecord
from kortex.storage.schema import postmortem_events, postmortem_items, postmortem_jobs, postmortems, turns

_j = postmortem_jobs.c
_it = postmortem_items.c
_p = postmortems.c

#: an item still owing work: the job is not over while one is in these
OPEN = ("queued", "dispatched", "running")
ACTIVE = ("dispatched", "running")  # what counts against a job's concurrency
ITEM_STATUSES = ("queued", "dispatched", "running", "done", "failed", "skipped", "cancelled")


def lock_tenant(conn: Connection, tenant_id: str) -> None:
    """Serialise the tenant's job submissions (a second job must see the first one's items, and
    count them against the tenant's cap on unfinished items)."""
    tenant_store.lock_tenant(conn, tenant_id)


def insert_job(conn: Connection, job: dict[str, Any], items: Sequence[dict[str, Any]]) -> None:
    conn.execute(insert(postmortem_jobs), [job])
    if items:
        conn.execute(insert(postmortem_items), list(items))


def job_by_key(conn: Connection, tenant_id: str, key: str) -> tuple[JobRecord, str | None] | None:
    """The job an Idempotency-Key made, with the hash of the request that made it."""
    row = conn.execute(select(postmortem_jobs).where(_j.tenant_id == tenant_id, _j.idempotency_key == key)).first()
    return (JobRecord.from_row(row), row.request_hash) if row else None


def get_job(conn: Connection, tenant_id: str, job_id: str, *, lock: bool = False) -> JobRecord:
    query = select(postmortem_jobs).where(_j.id == job_id, _j.tenant_id == tenant_id)
    row = conn.execute(query.with_for_update() if lock else query).first()
    if row is None:
        raise NotFound("post-mortem job not found")
    return JobRecord.from_row(row)


def list_jobs(conn: Connection, tenant_id: str, *, limit: int) -> list[JobRecord]:
    rows = conn.execute(select(postmortem_jobs).where(_j.tenant_id == tenant_id)
                        .order_by(_j.created_at.desc(), _j.id.desc()).limit(limit)).all()
    return [JobRecord.from_row(r) for r in rows]


def job_session(conn: Connection, tenant_id: str, job_id: str) -> str | None:
    return conn.execute(select(_j.session_id).where(_j.id == job_id, _j.tenant_id == tenant_id)).scalar()


def counts(conn: Connection, tenant_id: str, job_id: str) -> dict[str, int]:
    rows = conn.execute(select(_it.status, func.count()).where(_it.job_id == job_id, _it.tenant_id == tenant_id)
                        .group_by(_it.status)).all()
    found = {status: int(n) for status, n in rows}
    return {status: found.get(status, 0) for status in ITEM_STATUSES}


def spend(conn: Connection, tenant_id: str, job_id: str) -> float:
    """What the job has cost so far: its ended items' cost as settled, and its running items'
    turns as they stand (each step adds its calls' cost to its turn as it ends), so a budget
    check before an LLM call sees every earlier call, and a deleted session takes nothing away.
    One statement, so one snapshot: read in two, an item settling between them (running in the
    first, ended in the second) was counted in neither, and the spend dipped."""
    cost = case((_it.status.not_in(OPEN), _it.cost_usd),
                (_it.status == "running", func.coalesce(turns.c.cost_usd, 0.0)), else_=0.0)
    total = conn.execute(select(func.coalesce(func.sum(cost), 0.0))
                         .select_from(postmortem_items.outerjoin(turns, turns.c.id == _it.turn_id))
                         .where(_it.job_id == job_id, _it.tenant_id == tenant_id)).scalar()
    return float(total or 0.0)


def list_items(conn: Connection, tenant_id: str, job_id: str, *, after: int, limit: int,
               status: str | None = None) -> list[ItemRecord]:
    where = [_it.job_id == job_id, _it.tenant_id == tenant_id, _it.position > after]
    if status is not None:
        where.append(_it.status == status)
    rows = conn.execute(select(postmortem_items).where(*where).order_by(_it.position).limit(limit)).all()
    return [ItemRecord.from_row(r) for r in rows]


def _emit(conn: Connection, tenant_id: str, job_id: str, kind: str, item_id: str | None, now: datetime) -> None:
    """Number and record one progress event. The job row's update takes its lock until commit,
    so events of one job commit in the order of their numbers: a feed that has read up to n
    and reads again later never finds a smaller number appear behind it."""
    seq = conn.execute(update(postmortem_jobs).where(_j.id == job_id, _j.tenant_id == tenant_id)
                       .values(seq=_j.seq + 1).returning(_j.seq)).scalar_one()
    conn.execute(insert(postmortem_events).values(job_id=job_id, seq=seq, tenant_id=tenant_id, kind=kind,
                                                  item_id=item_id, created_at=now))


def events_after(conn: Connection, tenant_id: str, job_id: str, after: int, limit: int = 500) -> list[Any]:
    """(seq, kind, item_id, created_at) of the job's progress events after ``after``, in order."""
    e = postmortem_events.c
    return list(conn.execute(select(e.seq, e.kind, e.item_id, e.created_at)
                             .where(e.job_id == job_id, e.tenant_id == tenant_id, e.seq > after)
                             .order_by(e.seq).limit(limit)).all())


def items_by_id(conn: Connection, tenant_id: str, job_id: str, ids: set[str]) -> dict[str, ItemRecord]:
    if not ids:
        return {}
    rows = conn.execute(select(postmortem_items).where(_it.job_id == job_id, _it.tenant_id == tenant_id,
                                                       _it.id.in_(sorted(ids)))).all()
    return {r.id: ItemRecord.from_row(r) for r in rows}


def get_item(conn: Connection, tenant_id: str, item_id: str) -> ItemRecord | None:
    row = conn.execute(select(postmortem_items).where(_it.id == item_id, _it.tenant_id == tenant_id)).first()
    return ItemRecord.from_row(row) if row else None


def item_of_turn(conn: Connection, tenant_id: str, turn_id: str) -> ItemRecord | None:
    row = conn.execute(select(postmortem_items).where(_it.turn_id == turn_id, _it.tenant_id == tenant_id)).first()
    return ItemRecord.from_row(row) if row else None


def active_count(conn: Connection, job_id: str) -> int:
    return int(conn.execute(select(func.count()).where(_it.job_id == job_id, _it.status.in_(ACTIVE))).scalar() or 0)


def tenant_open_count(conn: Connection, tenant_id: str) -> int:
    """The tenant's unfinished items across all its jobs (``batch.max_open_items_per_tenant``),
    whatever the job's status: a job cancelled with ``running="finish"`` still runs its own."""
    return int(conn.execute(select(func.count()).where(_it.tenant_id == tenant_id, _it.status.in_(OPEN)))
               .scalar() or 0)


def tenant_active_count(conn: Connection, tenant_id: str) -> int:
    """The tenant's items in flight across all its jobs (the batch lane's share per tenant)."""
    return int(conn.execute(select(func.count()).where(_it.tenant_id == tenant_id, _it.status.in_(ACTIVE)))
               .scalar() or 0)


def dispatch_next(conn: Connection, job_id: str, n: int, now: datetime) -> list[ItemRecord]:
    """queued -> dispatched for the job's next ``n`` items in order. Rows another transaction
    is taking are skipped (PostgreSQL), so two advances of one job never take the same item."""
    if n <= 0:
        return []
    # A CTE, evaluated once: PostgreSQL ran ``id IN (SELECT ... LIMIT n FOR UPDATE)`` as a
    # subplan per row and dispatched every queued item of a job, whatever ``n`` was.
    chosen = (select(_it.id).where(_it.job_id == job_id, _it.status == "queued").order_by(_it.position).limit(n)
              .with_for_update(skip_locked=True).cte("chosen"))
    rows = conn.execute(update(postmortem_items).where(_it.id == chosen.c.id, _it.status == "queued")
                        .values(status="dispatched", dispatched_at=now).returning(*postmortem_items.c)).all()
    return sorted((ItemRecord.from_row(r) for r in rows), key=lambda i: i.position)


def start_item(conn: Connection, tenant_id: str, item_id: str, turn_id: str, now: datetime) -> bool:
    """dispatched -> running with its turn: once, whatever delivers the item's task twice."""
    row = conn.execute(update(postmortem_items)
                       .where(_it.id == item_id, _it.tenant_id == tenant_id, _it.status == "dispatched")
                       .values(status="running", turn_id=turn_id, started_at=now).returning(_it.job_id)).first()
    if row is not None:
        _emit(conn, tenant_id, row.job_id, "item_started", item_id, now)
    return row is not None


def end_item(conn: Connection, tenant_id: str, item_id: str, status: str, now: datetime, *,
             error: dict[str, Any] | None = None, cost_usd: float = 0.0,
             from_status: Sequence[str] = ("running",)) -> bool:
    row = conn.execute(update(postmortem_items)
                       .where(_it.id == item_id, _it.tenant_id == tenant_id, _it.status.in_(tuple(from_status)))
                       .values(status=status, error=error, cost_usd=cost_usd, finished_at=now)
                       .returning(_it.job_id)).first()
    if row is not None:
        _emit(conn, tenant_id, row.job_id, f"item_{status}", item_id, now)
    return row is not None


def end_open_items(conn: Connection, tenant_id: str, job_id: str, status: str, now: datetime,
                   error: dict[str, Any], from_status: Sequence[str] = ("queued", "dispatched")) -> int:
    """Items not yet started, ended in one statement (a cancel, a spent budget)."""
    rows = conn.execute(update(postmortem_items)
                        .where(_it.job_id == job_id, _it.tenant_id == tenant_id,
                               _it.status.in_(tuple(from_status)))
                        .values(status=status, error=error, finished_at=now)
                        .returning(_it.id, _it.position)).all()
    for row in sorted(rows, key=lambda r: r.position):
        _emit(conn, tenant_id, job_id, f"item_{status}", row.id, now)
    return len(rows)


def running_turns(conn: Connection, tenant_id: str, job_id: str) -> list[str]:
    return list(conn.execute(select(_it.turn_id).where(_it.job_id == job_id, _it.tenant_id == tenant_id,
                                                       _it.status == "running", _it.turn_id.is_not(None))).scalars())


def set_job_status(conn: Connection, tenant_id: str, job_id: str, status: str, now: datetime, *,
                   from_status: Sequence[str]) -> bool:
    values: dict[str, Any] = {"status": status}
    if status == "running":
        values["started_at"] = now
    else:
        values["finished_at"] = now
    row = conn.execute(update(postmortem_jobs)
                       .where(_j.id == job_id, _j.tenant_id == tenant_id, _j.status.in_(tuple(from_status)))
                       .values(**values).returning(_j.id)).first()
    if row is not None and status != "running":
        _emit(conn, tenant_id, job_id, f"job_{status}", None, now)
    return row is not None


def finish_if_complete(conn: Connection, tenant_id: str, job_id: str, now: datetime) -> bool:
    """running (or queued) -> done once no item is open (failed when items failed and none
    produced a document); one winner when two items end at once."""
    if conn.execute(select(exists().where(_it.job_id == job_id, _it.status.in_(OPEN)))).scalar():
        return False
    found = counts(conn, tenant_id, job_id)
    status = "failed" if found["failed"] and not found["done"] and not found["skipped"] else "done"
    return set_job_status(conn, tenant_id, job_id, status, now, from_status=("queued", "running"))


def insert_postmortem(conn: Connection, row: dict[str, Any]) -> bool:
    """Store an item's document unless it already has one; True when this call stored it. The
    ``rowcount`` of an ``ON CONFLICT DO NOTHING`` is not to be trusted across drivers, so the
    answer comes from ``RETURNING``."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(postmortems).values(**row).on_conflict_do_nothing(index_elements=["item_id"])
    return conn.execute(statement.returning(_p.id)).first() is not None


def latest_postmortem(conn: Connection, tenant_id: str, incident_ref: str) -> PostmortemRecord:
    row = conn.execute(select(postmortems).where(_p.tenant_id == tenant_id, _p.incident_ref == incident_ref)
                       .order_by(_p.created_at.desc(), _p.id.desc()).limit(1)).first()
    if row is None:
        raise NotFound("no post-mortem for this incident")
    return PostmortemRecord.from_row(row)


def postmortems_of_job(conn: Connection, tenant_id: str, job_id: str, *, after: str | None,
                       limit: int) -> list[PostmortemRecord]:
    """A page of the job's documents in incident order, after the incident ``after``: a job
    writes at most one document per incident (one item each), so the incident is the cursor."""
    where = [_p.tenant_id == tenant_id, _p.job_id == job_id]
    if after is not None:
        where.append(_p.incident_ref > after)
    rows = conn.execute(select(postmortems).where(*where).order_by(_p.incident_ref).limit(limit)).all()
    return [PostmortemRecord.from_row(r) for r in rows]


def existing_refs(conn: Connection, tenant_id: str, refs: Sequence[str]) -> dict[str, str]:
    """Incident refs that already have a post-mortem, with the latest one's id."""
    if not refs:
        return {}
    rows = conn.execute(select(_p.incident_ref, _p.id).where(_p.tenant_id == tenant_id, _p.incident_ref.in_(refs))
                        .order_by(_p.created_at)).all()
    return {r.incident_ref: r.id for r in rows}


def any_open(conn: Connection, tenant_id: str, job_id: str) -> bool:
    return bool(conn.execute(select(exists().where(_it.job_id == job_id, _it.tenant_id == tenant_id,
                                                   _it.status.in_(OPEN)))).scalar())


def open_refs(conn: Connection, tenant_id: str, refs: Sequence[str]) -> set[str]:
    """Incident refs with an item still open in any of the tenant's jobs, whatever the job's
    status: a job cancelled with ``running="finish"`` is over, but its running items still
    write (and bill) their post-mortems. No item stays open for good in an ended job: a cancel
    ends the items not started, and a running one is settled by its turn's end hook."""
    if not refs:
        return set()
    rows = conn.execute(select(_it.incident_ref).where(_it.tenant_id == tenant_id, _it.incident_ref.in_(refs),
                                                       _it.status.in_(OPEN))).scalars()
    return set(rows)


def stale_dispatched(conn: Connection, cutoff: datetime, limit: int = 500) -> list[ItemRecord]:
    """Items handed to the batch queue before ``cutoff`` whose task never started them."""
    rows = conn.execute(select(postmortem_items).where(_it.status == "dispatched", _it.dispatched_at < cutoff)
                        .order_by(_it.dispatched_at).limit(limit)).all()
    return [ItemRecord.from_row(r) for r in rows]


def jobs_with_room(conn: Connection, limit: int = 100) -> list[tuple[str, str]]:
    """(tenant, job) of running jobs with queued items and fewer active ones than their
    concurrency, or none open at all (done, but not yet marked so)."""
    active = (select(func.count()).where(_it.job_id == _j.id, _it.status.in_(ACTIVE))
              .correlate(postmortem_jobs).scalar_subquery())
    queued = exists().where(_it.job_id == _j.id, _it.status == "queued")
    opened = exists().where(_it.job_id == _j.id, _it.status.in_(OPEN))
    rows = conn.execute(select(_j.tenant_id, _j.id).where(
        _j.status.in_(("queued", "running")),
        (and_(queued, active < _j.concurrency)) | ~opened,
    ).limit(limit)).all()
    return [(r.tenant_id, r.id) for r in rows]


__all__ = ["ACTIVE", "ITEM_STATUSES", "OPEN"]
