"""tool fixes: metric series keys, a trace index on logs, proposal execution recovery

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from alembic import op

import kortex.storage.types as kt

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

_BATCH = 5000


def _labels_key(labels: Any) -> str:  # the JSON column's value: a dict, None, or (some drivers) its text
    """A frozen copy of kortex.telemetry.embedded_metrics.labels_key (migrations must not change)."""
    if isinstance(labels, str):
        labels = json.loads(labels or "{}")
    items = sorted((str(k), str(v)) for k, v in (labels or {}).items())
    return "," + "".join(f"{k}={quote(v, safe='')}," for k, v in items)


def _backfill_labels_keys() -> None:
    conn = op.get_bind()
    metrics = sa.table('telemetry_metrics', sa.column('id', sa.BigInteger()), sa.column('labels', sa.JSON()),
                       sa.column('labels_key', sa.Text()))
    last = 0
    while True:
        rows = conn.execute(sa.select(metrics.c.id, metrics.c.labels).where(metrics.c.id > last)
                            .order_by(metrics.c.id).limit(_BATCH)).all()
        if not rows:
            return
        changed = [{"p_id": r.id, "p_key": _labels_key(r.labels)} for r in rows]
        changed = [c for c in changed if c["p_key"] != ","]
        if changed:
            conn.execute(metrics.update().where(metrics.c.id == sa.bindparam("p_id"))
                         .values(labels_key=sa.bindparam("p_key")), changed)
        last = rows[-1].id


def upgrade() -> None:
    with op.batch_alter_table('telemetry_metrics', schema=None) as batch_op:
        batch_op.add_column(sa.Column('labels_key', sa.Text(), server_default=',', nullable=False))
    _backfill_labels_keys()
    with op.batch_alter_table('telemetry_logs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_telemetry_logs_tenant_id_trace_id'), ['tenant_id', 'trace_id'],
                              unique=False)
    with op.batch_alter_table('proposals', schema=None) as batch_op:
        batch_op.add_column(sa.Column('execution_attempts', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('execution_started_at', kt.UTCDateTime(), nullable=True))
        batch_op.create_index(batch_op.f('ix_proposals_execution_status_execution_started_at'),
                              ['execution_status', 'execution_started_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('proposals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_proposals_execution_status_execution_started_at'))
        batch_op.drop_column('execution_started_at')
        batch_op.drop_column('execution_attempts')
    with op.batch_alter_table('telemetry_logs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_telemetry_logs_tenant_id_trace_id'))
    with op.batch_alter_table('telemetry_metrics', schema=None) as batch_op:
        batch_op.drop_column('labels_key')
