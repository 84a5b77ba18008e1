"""step leases: an attempt counter and a renewable lease on turns

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import kortex.storage.types as kt

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attempt', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('lease_until', kt.UTCDateTime(), nullable=True))
        batch_op.create_index(batch_op.f('ix_turns_status_lease_until'), ['status', 'lease_until'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_turns_status_lease_until'))
        batch_op.drop_column('lease_until')
        batch_op.drop_column('attempt')
