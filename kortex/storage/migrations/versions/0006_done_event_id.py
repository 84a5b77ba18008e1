"""turns.done_event_id: the stream id of a turn's published ``done``

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('turns') as batch:
        batch.add_column(sa.Column('done_event_id', sa.String(length=48), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('turns') as batch:
        batch.drop_column('done_event_id')
