"""The retention policy's pruning on PostgreSQL (tests/kortex/storage/test_retention.py has the
checks, run there on SQLite), each on a database of its own (pruning spans every tenant), and the
audit trigger that lets a pruning transaction delete what is older than the cutoff it names and
nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select, text

from kortex.errors import KortexError
from kortex.storage.db import Database
from kortex.storage.schema import decisions
from kortex.testing.scratch import throwaway_database
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN
from tests.kortex.storage import test_retention as checks

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def template() -> Iterator[str]:
    with throwaway_database(PG_ADMIN, prefix="kortex_test_retention", migrated=True) as (_url, name):
        yield name


@pytest.fixture
def db(template: str) -> Iterator[Database]:
    with throwaway_database(PG_ADMIN, options=f'TEMPLATE "{template}"') as (url, _name):
        database = Database(url)
        try:
            yield database
        finally:
            database.dispose()


def test_only_old_rows_go_and_a_jobs_items_and_events_go_with_it_on_postgresql(db: Database) -> None:
    checks.only_old_rows_go_and_a_jobs_items_and_events_go_with_it(db)


def test_batches_take_at_most_batch_rows_each_in_its_own_transaction_on_postgresql(db: Database) -> None:
    checks.batches_take_at_most_batch_rows_each_in_its_own_transaction(db)


def test_off_keeps_everything_on_postgresql(db: Database) -> None:
    checks.off_keeps_everything(db)


def test_a_dry_run_counts_what_would_go_and_deletes_nothing_on_postgresql(db: Database) -> None:
    checks.a_dry_run_counts_what_would_go_and_deletes_nothing(db)


def test_revoked_keys_go_once_revoked_longer_than_revoked_keys_days_on_postgresql(db: Database) -> None:
    checks.revoked_keys_go_once_revoked_longer_than_revoked_keys_days(db)


def test_deleting_old_revoked_keys_never_hides_a_revocation_from_the_embedded_epoch_on_postgresql(
        db: Database, tmp_path: Path) -> None:
    # No Redis: the epoch is read from the database.
    h = Harness(make_settings(tmp_path, db.url.render_as_string(hide_password=False)))
    try:
        checks.deleting_old_revoked_keys_never_hides_a_revocation_from_the_embedded_epoch(h)
    finally:
        h.close()


def test_a_run_stops_at_its_time_bound_and_the_next_starts_where_it_stopped_on_postgresql(db: Database) -> None:
    checks.a_run_stops_at_its_time_bound_and_the_next_starts_where_it_stopped(db)


def test_a_lock_held_past_the_bound_ends_the_run_there_not_in_an_error_on_postgresql(db: Database) -> None:
    checks.a_lock_held_past_the_bound_ends_the_run_there_not_in_an_error(db)


def _audit_rows(db: Database) -> int:
    with db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(decisions)).scalar() or 0)


def test_the_audit_trigger_lets_only_a_named_cutoff_delete_and_only_rows_older_than_it(db: Database) -> None:
    a = checks.tenant(db, "a")
    checks.audit(db, a, checks.OLD["audit"])
    checks.audit(db, a, checks.YOUNG["audit"])
    cutoff = checks.NOW - timedelta(days=400)
    with pytest.raises(KortexError, match="database error"), db.begin() as conn:  # no cutoff named
        conn.execute(delete(decisions))
    with pytest.raises(KortexError), db.begin() as conn:  # a row newer than the cutoff named
        conn.execute(text("SELECT set_config('kortex.prune_audit_before', :c, true)"), {"c": cutoff.isoformat()})
        conn.execute(delete(decisions))
    with pytest.raises(KortexError), db.begin() as conn:
        conn.execute(text("SELECT set_config('kortex.prune_audit_before', :c, true)"), {"c": cutoff.isoformat()})
        conn.execute(decisions.update().values(ok=False))  # an UPDATE, whatever the cutoff
    # A cutoff under a month back is refused by the database itself, whatever the settings say.
    with pytest.raises(KortexError), db.begin() as conn:
        recent = checks.NOW - timedelta(days=10)
        conn.execute(text("SELECT set_config('kortex.prune_audit_before', :c, true)"), {"c": recent.isoformat()})
        conn.execute(delete(decisions).where(decisions.c.created_at < cutoff))
    assert _audit_rows(db) == 2
    with db.begin() as conn:
        conn.execute(text("SELECT set_config('kortex.prune_audit_before', :c, true)"), {"c": cutoff.isoformat()})
        assert conn.execute(delete(decisions).where(decisions.c.created_at < cutoff)).rowcount == 1
    # The setting ended with its transaction, on the same pooled connection too.
    with db.begin() as conn:
        assert conn.execute(text("SELECT current_setting('kortex.prune_audit_before', true)")).scalar() in (None, "")
    with pytest.raises(KortexError), db.begin() as conn:
        conn.execute(delete(decisions))
    assert _audit_rows(db) == 1
