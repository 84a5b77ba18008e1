"""api_keys.role: what a key may do (kortex/access.py); existing keys keep full access

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.add_column(sa.Column('role', sa.String(length=16), nullable=False, server_default='admin'))


def downgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('role')
