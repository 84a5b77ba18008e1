"""chat_messages.grounding: what the server found when it checked a final answer's citations
against its turn's tool calls (kortex/turns/grounding.py)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import kortex.storage.types as kt

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('chat_messages', sa.Column('grounding', kt.JSONType, nullable=True))


def downgrade() -> None:
    op.drop_column('chat_messages', 'grounding')
