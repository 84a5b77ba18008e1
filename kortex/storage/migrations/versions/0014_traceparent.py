"""turns.traceparent, tool_invocations.traceparent: the W3C trace context of the span that
created the row, so work the watchdog hands on again joins the turn's trace (kortex/tracing.py)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: adding the columns rewrites no row (a turn from before has no trace).
    op.add_column('turns', sa.Column('traceparent', sa.String(length=64), nullable=True))
    op.add_column('tool_invocations', sa.Column('traceparent', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tool_invocations') as batch:
        batch.drop_column('traceparent')
    with op.batch_alter_table('turns') as batch:
        batch.drop_column('traceparent')
