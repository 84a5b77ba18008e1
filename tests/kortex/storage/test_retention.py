"""The retention policy's pruning on SQLite (tests/integration/test_retention_pg.py runs the same
checks on PostgreSQL): only rows past their cutoff go, in batches of at most ``batch_rows``, a
job's items and events with it; a revoked API key once revoked long enough, never an active one,
and never so that a revocation goes unseen; "off" keeps everything; a dry run deletes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, event, func, insert, select, update

from kortex import keys
from kortex.config_retention import RetentionSettings
from kortex.errors import AuthError, KortexError
from kortex.storage import tenants
from kortex.storage.db import Database
from kortex.storage.retention import TABLES, prune
from kortex.storage.schema import (
    api_keys,
    chat_messages,
    chat_sessions,
    decisions,
    llm_requests,
    postmortem_events,
    postmortem_items,
    postmortem_jobs,
    postmortems,
    telemetry_deploys,
    telemetry_logs,
    telemetry_metrics,
    telemetry_spans,
    turns,
)
from kortex.timeparse import utcnow
from tests.conftest import Harness

NOW = utcnow()
#: just past each default cutoff (30, 400, 180 and 90 days), and just inside it
OLD = {"telemetry": NOW - timedelta(days=30, hours=1), "audit": NOW - timedelta(days=400, hours=1),
       "postmortem": NOW - timedelta(days=180, hours=1), "revoked_keys": NOW - timedelta(days=90, hours=1)}
YOUNG = {"telemetry": NOW - timedelta(days=29, hours=23), "audit": NOW - timedelta(days=399, hours=23),
         "postmortem": NOW - timedelta(days=179, hours=23), "revoked_keys": NOW - timedelta(days=89, hours=23)}


def _id() -> str:
    return str(uuid.uuid4())


def tenant(db: Database, name: str) -> str:
    with db.begin() as conn:
        return tenants.create_tenant(conn, name).id


def telemetry(db: Database, tenant_id: str, at: datetime, n: int = 1) -> None:
    """``n`` rows of each telemetry table the policy prunes, all at ``at``."""
    with db.begin() as conn:
        for _ in range(n):
            conn.execute(insert(telemetry_logs).values(tenant_id=tenant_id, product="p", ts=at, severity=40,
                                                       level="error", message="boom"))
            conn.execute(insert(telemetry_metrics).values(tenant_id=tenant_id, product="p", metric="m", labels={},
                                                          labels_key=",", ts=at, value=1.0))
            conn.execute(insert(telemetry_spans).values(tenant_id=tenant_id, trace_id=_id(), span_id="s",
                                                        service="p", operation="GET", start_ts=at, duration_us=5,
                                                        status="ok"))
            conn.execute(insert(telemetry_deploys).values(tenant_id=tenant_id, product="p", ts=at, version="v1"))
            conn.execute(insert(llm_requests).values(tenant_id=tenant_id, request_id=_id(), user_id="u",
                                                     user_tier="standard", deployment_id="m/b", model_id="m",
                                                     backend_id="b", latency_ms=5, status="success", created_at=at))


def audit(db: Database, tenant_id: str, at: datetime, n: int = 1) -> None:
    with db.begin() as conn:
        for _ in range(n):
            conn.execute(insert(decisions).values(id=_id(), tenant_id=tenant_id, kind="llm_call", subject="x:y",
                                                  ok=True, payload={}, created_at=at))


def key(db: Database, tenant_id: str, revoked_at: datetime | None = None) -> str:
    """A key of the tenant made 1,000 days ago (the whole key, as its client holds it), revoked at
    ``revoked_at``, with its revocation in the audit trail as kortex/keys.py writes it."""
    with db.begin() as conn:
        issued = tenants.issue_api_key(conn, tenant_id, role="chat")
        conn.execute(update(api_keys).where(api_keys.c.key_id == issued.key_id)
                     .values(created_at=NOW - timedelta(days=1000), revoked_at=revoked_at))
        if revoked_at is not None:
            conn.execute(insert(decisions).values(id=_id(), tenant_id=tenant_id, kind="key_revoked",
                                                  subject=issued.key_id, ok=True, payload={}, created_at=revoked_at))
    return issued.key


def key_id(key: str) -> str:
    return key.split("_")[1]


def job(db: Database, tenant_id: str, at: datetime, *, status: str = "done", items: int = 1,
        item_status: str = "done", document: bool = False) -> str:
    """A job made at ``at`` with ``items`` items and one progress event per item; ``document``:
    its first item wrote a post-mortem."""
    job_id = _id()
    with db.begin() as conn:
        conn.execute(insert(postmortem_jobs).values(id=job_id, tenant_id=tenant_id, status=status, selection={},
                                                    concurrency=1, seq=items, created_at=at))
        for n in range(items):
            item_id = _id()
            conn.execute(insert(postmortem_items).values(id=item_id, tenant_id=tenant_id, job_id=job_id, position=n,
                                                         incident_ref=f"INC-{n}", incident={}, status=item_status))
            conn.execute(insert(postmortem_events).values(job_id=job_id, seq=n + 1, tenant_id=tenant_id,
                                                          kind=f"item_{item_status}", item_id=item_id, created_at=at))
            if document and n == 0:
                conn.execute(insert(postmortems).values(id=_id(), tenant_id=tenant_id, item_id=item_id, job_id=job_id,
                                                        incident_ref="INC-0", document={}, created_at=at))
    return job_id


def conversation(db: Database, tenant_id: str, at: datetime) -> None:
    """A chat session with a finished turn and its message, as old as ``at``: user data, never pruned."""
    session_id, turn_id = _id(), _id()
    with db.begin() as conn:
        conn.execute(insert(chat_sessions).values(id=session_id, tenant_id=tenant_id, name="s", turn_count=1,
                                                  created_at=at, updated_at=at))
        conn.execute(insert(turns).values(id=turn_id, tenant_id=tenant_id, session_id=session_id, turn_no=1,
                                          status="done", deadline_at=at, created_at=at, updated_at=at))
        conn.execute(insert(chat_messages).values(id=_id(), tenant_id=tenant_id, session_id=session_id,
                                                  turn_id=turn_id, turn_no=1, step=-1, ord=0, role="user",
                                                  content="why?", created_at=at))


def counts(db: Database) -> dict[str, int]:
    from kortex.storage.schema import metadata

    with db.connect() as conn:
        return {name: int(conn.execute(select(func.count()).select_from(metadata.tables[name])).scalar() or 0)
                for name in (*TABLES, "postmortems", "chat_sessions", "turns", "chat_messages")}


def rows(**found: int) -> dict[str, int]:
    return {**dict.fromkeys(TABLES, 0), **found}


@pytest.fixture
def db(sqlite_url: str) -> Iterator[Database]:
    database = Database(sqlite_url)
    yield database
    database.dispose()


def only_old_rows_go_and_a_jobs_items_and_events_go_with_it(db: Database) -> None:
    a, b = tenant(db, "a"), tenant(db, "b")
    for t, n in ((a, 3), (b, 2)):
        telemetry(db, t, OLD["telemetry"], n)
        telemetry(db, t, YOUNG["telemetry"])
        audit(db, t, OLD["audit"], n)
        audit(db, t, YOUNG["audit"])
        conversation(db, t, NOW - timedelta(days=1000))
    gone = job(db, a, OLD["postmortem"], items=2, document=True)
    job(db, b, OLD["postmortem"], status="cancelled", items=1, item_status="cancelled")
    kept = [job(db, a, YOUNG["postmortem"]),                          # not old enough
            job(db, a, OLD["postmortem"], status="running", item_status="running"),  # still running
            # cancelled with running=finish: its item still writes its post-mortem
            job(db, b, OLD["postmortem"], status="cancelled", item_status="running")]
    before = counts(db)

    report = prune(db, RetentionSettings(), now=NOW)

    telemetry_rows = dict.fromkeys(("telemetry_logs", "telemetry_metrics", "telemetry_spans", "telemetry_deploys",
                                    "llm_requests"), 5)
    assert report.finished and report.rows == rows(**telemetry_rows, decisions=5, postmortem_jobs=2,
                                                   postmortem_items=3, postmortem_events=3)
    after = counts(db)
    assert after == {name: before[name] - report.rows.get(name, 0) for name in before}
    with db.connect() as conn:
        assert set(conn.execute(select(postmortem_jobs.c.id)).scalars()) == set(kept)
        assert not conn.execute(select(postmortem_items.c.id).where(postmortem_items.c.job_id == gone)).first()
        # The document outlives its job's bookkeeping: only its link to the item is cleared.
        assert conn.execute(select(postmortems.c.item_id, postmortems.c.job_id)).one() == (None, gone)
        assert set(conn.execute(select(telemetry_logs.c.ts)).scalars()) == {YOUNG["telemetry"]}
    assert (after["chat_sessions"], after["turns"], after["chat_messages"]) == (2, 2, 2)
    with pytest.raises(KortexError), db.begin() as conn:  # the audit trail still refuses a DELETE
        conn.execute(delete(decisions))
    assert prune(db, RetentionSettings(), now=NOW).rows == rows()  # nothing left to do


class Statements:
    """The DELETE statements a run made, with the rows each took, and where the commits fell."""

    def __init__(self, db: Database) -> None:
        self.deleted: list[tuple[str, int]] = []
        self.order: list[str] = []  # D: a DELETE that took rows, C: a commit
        event.listen(db.engine, "after_cursor_execute", self._executed)
        event.listen(db.engine, "commit", self._committed)

    def _executed(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM") and cursor.rowcount:
            self.deleted.append((statement.split()[2], cursor.rowcount))
            self.order.append("D")

    def _committed(self, conn: Any) -> None:
        self.order.append("C")

    def of(self, table: str) -> list[int]:
        return [n for name, n in self.deleted if name == table]


def batches_take_at_most_batch_rows_each_in_its_own_transaction(db: Database) -> None:
    a, b = tenant(db, "a"), tenant(db, "b")
    telemetry(db, a, OLD["telemetry"], 5)
    telemetry(db, b, OLD["telemetry"], 3)
    small = [job(db, a, OLD["postmortem"]) for _ in range(3)]  # 3 rows each: job, item, event
    big = job(db, b, OLD["postmortem"], items=3)                # 7 rows: more than a batch, so alone
    seen = Statements(db)

    report = prune(db, RetentionSettings(batch_rows=4), now=NOW)

    assert report.rows["telemetry_logs"] == 8 and report.rows["postmortem_jobs"] == 4
    assert seen.of("telemetry_logs") == [4, 4]  # every tenant's at once, the oldest first
    # One job a batch: two of three rows each would be six. The one larger than a batch goes alone.
    assert seen.of("postmortem_jobs") == [1, 1, 1, 1]
    assert "DD" not in "".join(seen.order)  # every DELETE committed in a transaction of its own
    with db.connect() as conn:
        assert not conn.execute(select(postmortem_jobs.c.id).where(postmortem_jobs.c.id.in_([*small, big]))).first()
        assert conn.execute(select(func.count()).select_from(postmortem_items)).scalar() == 0


def off_keeps_everything(db: Database) -> None:
    a = tenant(db, "a")
    telemetry(db, a, OLD["telemetry"] - timedelta(days=3000))
    audit(db, a, OLD["audit"] - timedelta(days=3000))
    job(db, a, OLD["postmortem"] - timedelta(days=3000))
    key(db, a, OLD["revoked_keys"] - timedelta(days=3000))
    before = counts(db)
    off = RetentionSettings(telemetry_days="off", audit_days="off", postmortem_days="off",  # type: ignore[arg-type]
                            revoked_keys_days="off")
    assert not off.enabled
    assert prune(db, off, now=NOW).rows == rows() and counts(db) == before
    # One policy off, the others still apply.
    report = prune(db, RetentionSettings(telemetry_days="off"), now=NOW)  # type: ignore[arg-type]
    assert report.rows == rows(decisions=2, postmortem_jobs=1, postmortem_items=1, postmortem_events=1, api_keys=1)
    assert counts(db)["telemetry_logs"] == 1


def a_dry_run_counts_what_would_go_and_deletes_nothing(db: Database) -> None:
    a, b = tenant(db, "a"), tenant(db, "b")
    telemetry(db, a, OLD["telemetry"], 2)
    telemetry(db, b, YOUNG["telemetry"])
    audit(db, b, OLD["audit"])
    job(db, a, OLD["postmortem"], items=2)
    job(db, a, OLD["postmortem"], status="running", item_status="running")
    key(db, b, OLD["revoked_keys"])
    key(db, b)
    before = counts(db)

    dry = prune(db, RetentionSettings(), now=NOW, dry_run=True)

    assert dry.dry_run and counts(db) == before
    assert dry.rows == rows(telemetry_logs=2, telemetry_metrics=2, telemetry_spans=2, telemetry_deploys=2,
                            llm_requests=2, decisions=1, postmortem_jobs=1, postmortem_items=2, postmortem_events=2,
                            api_keys=1)
    assert prune(db, RetentionSettings(), now=NOW).rows == dry.rows


class Clock:
    """A second passes each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def a_run_stops_at_its_time_bound_and_the_next_starts_where_it_stopped(db: Database) -> None:
    a, b = tenant(db, "a"), tenant(db, "b")
    telemetry(db, a, OLD["telemetry"])
    audit(db, b, OLD["audit"])
    job(db, b, OLD["postmortem"])
    policy = RetentionSettings(batch_rows=1, run_seconds=3)
    report = prune(db, policy, now=NOW, clock=Clock())
    # The clock is read as the run starts and before each batch: two batches fit in three seconds,
    # which do not reach every table and tenant (twelve: logs, metrics and spans and revoked keys
    # of every tenant at once, the rest one tenant at a time), let alone finish them.
    assert not report.finished and report.total == 2 and report.resume == 2
    runs = 1
    while counts(db)["postmortem_jobs"]:  # the last in the order is reached too, by runs as short
        report = prune(db, policy, now=NOW, start=report.resume, clock=Clock())
        runs += 1
        taken_along = report.rows["postmortem_items"] + report.rows["postmortem_events"]
        assert report.total - taken_along <= 2 and runs < 20  # two batches a run, a job's rows one
    assert {name: n for name, n in counts(db).items() if name in TABLES} == rows()


def a_lock_held_past_the_bound_ends_the_run_there_not_in_an_error(db: Database) -> None:
    a = tenant(db, "a")
    telemetry(db, a, OLD["telemetry"])
    with db.begin() as holder:  # another writer holds the old rows (PostgreSQL) or the database (SQLite)
        if db.is_sqlite:
            holder.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            holder.execute(select(telemetry_logs.c.id).with_for_update())
        report = prune(db, RetentionSettings(run_seconds=0.5), now=NOW)
        assert not report.finished and report.total == 0
    assert prune(db, RetentionSettings(), now=NOW).rows["telemetry_logs"] == 1


def revoked_keys_go_once_revoked_longer_than_revoked_keys_days(db: Database) -> None:
    a, b = tenant(db, "a"), tenant(db, "b")
    active = key(db, a)                                   # made 1,000 days ago: its age is no matter
    gone = [key(db, a, OLD["revoked_keys"]), key(db, b, OLD["revoked_keys"] - timedelta(days=100))]
    recent = key(db, b, YOUNG["revoked_keys"])
    every = {key_id(k) for k in (active, recent, *gone)}
    assert prune(db, RetentionSettings(revoked_keys_days="off"), now=NOW).rows == rows()  # type: ignore[arg-type]
    before = counts(db)

    report = prune(db, RetentionSettings(), now=NOW)

    assert report.finished and report.rows == rows(api_keys=2)
    assert counts(db) == {**before, "api_keys": before["api_keys"] - 2}  # the revocations' audit rows stay
    with db.connect() as conn:
        assert set(conn.execute(select(api_keys.c.key_id)).scalars()) == {key_id(active), key_id(recent)}
        for deleted in gone:  # unknown now, refused as it was when revoked
            with pytest.raises(AuthError):
                tenants.authenticate(conn, deleted)
        assert tenants.authenticate(conn, active).tenant.id == a
        assert tenants.valid_key_ids(conn, every) == {key_id(active)}
        audited = conn.execute(select(decisions.c.subject).where(decisions.c.kind == "key_revoked")).scalars()
        assert set(audited) == {key_id(k) for k in (recent, *gone)}
    assert prune(db, RetentionSettings(), now=NOW).rows == rows()


def test_only_old_rows_go_and_a_jobs_items_and_events_go_with_it(db: Database) -> None:
    only_old_rows_go_and_a_jobs_items_and_events_go_with_it(db)


def test_batches_take_at_most_batch_rows_each_in_its_own_transaction(db: Database) -> None:
    batches_take_at_most_batch_rows_each_in_its_own_transaction(db)


def test_off_keeps_everything(db: Database) -> None:
    off_keeps_everything(db)


def test_a_dry_run_counts_what_would_go_and_deletes_nothing(db: Database) -> None:
    a_dry_run_counts_what_would_go_and_deletes_nothing(db)


def test_revoked_keys_go_once_revoked_longer_than_revoked_keys_days(db: Database) -> None:
    revoked_keys_go_once_revoked_longer_than_revoked_keys_days(db)


def deleting_old_revoked_keys_never_hides_a_revocation_from_the_embedded_epoch(h: Harness) -> None:
    """The embedded mode's API processes forget the keys they verified, and check their open
    streams' keys again, when ``revocation_epoch`` moves (api/revocation.py). A run that deletes
    as many old revoked keys as a revocation adds must not leave it where it was: here the new
    revocation's time is behind the latest one's too (its transaction stamped it first but
    committed second), so neither the count nor the latest time of the revoked keys moves."""
    assert h.settings.embedded
    a = h.tenant("a")
    h.api_key(a)
    old = key(h.k.db, a, OLD["revoked_keys"])
    key(h.k.db, a, NOW - timedelta(seconds=1))
    doomed = key(h.k.db, a)
    seen = keys.revocation_epoch(h.k)

    with h.k.db.begin() as conn:
        conn.execute(update(api_keys).where(api_keys.c.key_id == key_id(doomed))
                     .values(revoked_at=NOW - timedelta(seconds=2)))
    assert prune(h.k.db, RetentionSettings(), now=NOW).rows == rows(api_keys=1)

    assert keys.revocation_epoch(h.k) != seen
    for refused in (old, doomed):
        with pytest.raises(AuthError):
            keys.authenticate(h.k, refused)


def test_deleting_old_revoked_keys_never_hides_a_revocation_from_the_embedded_epoch(harness: Harness) -> None:
    deleting_old_revoked_keys_never_hides_a_revocation_from_the_embedded_epoch(harness)


def test_a_run_stops_at_its_time_bound_and_the_next_starts_where_it_stopped(db: Database) -> None:
    a_run_stops_at_its_time_bound_and_the_next_starts_where_it_stopped(db)


def test_a_lock_held_past_the_bound_ends_the_run_there_not_in_an_error(db: Database) -> None:
    a_lock_held_past_the_bound_ends_the_run_there_not_in_an_error(db)


def test_the_sqlite_audit_trigger_is_dropped_only_inside_the_pruning_transaction(db: Database) -> None:
    a = tenant(db, "a")
    audit(db, a, OLD["audit"], 2)
    with db.connect() as conn:
        trigger = "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'decisions_no_delete'"
        guard = conn.exec_driver_sql(trigger).scalar()
    assert guard
    telemetry(db, a, OLD["telemetry"])
    with db.begin() as conn:  # a batch that fails after dropping the trigger: the drop is undone with it
        from kortex.storage import retention

        dropped = retention._lift_audit_guard(conn, NOW)
        assert dropped == guard
        with db.connect() as other:  # another connection never sees it gone
            assert other.exec_driver_sql(trigger).scalar() == guard
        conn.rollback()
    with db.connect() as conn:
        assert conn.exec_driver_sql(trigger).scalar() == guard
    assert prune(db, RetentionSettings(), now=NOW).rows["decisions"] == 2
    with db.connect() as conn:
        assert conn.exec_driver_sql(trigger).scalar() == guard
