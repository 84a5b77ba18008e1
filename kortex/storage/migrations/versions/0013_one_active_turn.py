"""turns: a unique index allowing each session one active turn, so a post writes its turn in one
statement with no transaction or count read around it (kortex/storage/posting.py)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import kortex.storage.types as kt

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

# Written out, not imported: a migration keeps meaning what it meant when it was written.
INDEX = "uq_turns_one_active_per_session"
STATUSES = ("queued", "running", "waiting_tools")
ACTIVE = "status IN ('queued', 'running', 'waiting_tools')"


def upgrade() -> None:
    # Posts checked the rule themselves before; should a session still hold two active turns,
    # the older ones are ended as failed (what the watchdog would make of them at their
    # deadline), or the index could not be built.
    turns = sa.table("turns", sa.column("session_id", kt.UUIDStr()), sa.column("turn_no", sa.Integer()),
                     sa.column("status", sa.String()), sa.column("lease_until", kt.UTCDateTime()),
                     sa.column("finished_at", kt.UTCDateTime()), sa.column("updated_at", kt.UTCDateTime()),
                     sa.column("error", kt.JSONType))
    newer = turns.alias("newer")
    now = datetime.now(UTC)
    op.execute(
        turns.update()
        .where(sa.text(ACTIVE), sa.exists().where(newer.c.session_id == turns.c.session_id,
                                                  newer.c.status.in_(STATUSES), newer.c.turn_no > turns.c.turn_no))
        .values(status="failed", lease_until=None, finished_at=now, updated_at=now,
                error={"code": "superseded", "message": "a newer turn of the session was active"})
    )
    op.create_index(INDEX, 'turns', ['session_id'], unique=True,
                    postgresql_where=sa.text(ACTIVE), sqlite_where=sa.text(ACTIVE))


def downgrade() -> None:
    op.drop_index(INDEX, table_name='turns')
