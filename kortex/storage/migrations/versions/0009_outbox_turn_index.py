"""stream_outbox: index on turn_id, so a step's claim sees in the same statement whether its
turn has kept events to publish first

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(op.f('ix_stream_outbox_turn_id'), 'stream_outbox', ['turn_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_stream_outbox_turn_id'), table_name='stream_outbox')
