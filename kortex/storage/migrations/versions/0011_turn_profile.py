"""turns.profile: the kind of turn (kortex/turns/profiles.py), so a step resumed anywhere runs
it with the same prompt, tools, budget scope and finish hook

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('turns', sa.Column('profile', sa.String(length=32), nullable=False, server_default='chat'))


def downgrade() -> None:
    op.drop_column('turns', 'profile')
