"""stream_outbox: structural events Redis refused, kept until they are published

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import kortex.storage.types as kt

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'stream_outbox',
        sa.Column('id', kt.BigIntPK, autoincrement=True, nullable=False),
        sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
        sa.Column('turn_id', kt.UUIDStr(), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('final', sa.Boolean(), nullable=False),
        sa.Column('events', kt.JSONType, nullable=False),
        sa.Column('created_at', kt.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_stream_outbox_tenant_id_tenants'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_stream_outbox')),
    )
    op.create_index(op.f('ix_stream_outbox_created_at'), 'stream_outbox', ['created_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_stream_outbox_created_at'), table_name='stream_outbox')
    op.drop_table('stream_outbox')
