"""chat_sessions.idempotency_key, chat_sessions.request_hash: POST /v1/sessions takes an
Idempotency-Key, as a message's post does, so a client whose answer was lost learns the session
it made; a unique index on (tenant_id, idempotency_key), over keyed rows only, makes one session
of two racing requests with one key (kortex/turns/chat.py, new_session)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

# Written out, not imported: a migration keeps meaning what it meant when it was written.
INDEX = "uq_chat_sessions_tenant_id_idempotency_key"
KEYED = "idempotency_key IS NOT NULL"


def upgrade() -> None:
    # Nullable, no default: adding the columns rewrites no row (a session from before has no key),
    # and the index over keyed rows starts empty.
    op.add_column('chat_sessions', sa.Column('idempotency_key', sa.String(length=200), nullable=True))
    op.add_column('chat_sessions', sa.Column('request_hash', sa.String(length=64), nullable=True))
    op.create_index(INDEX, 'chat_sessions', ['tenant_id', 'idempotency_key'], unique=True,
                    postgresql_where=sa.text(KEYED), sqlite_where=sa.text(KEYED))


def downgrade() -> None:
    op.drop_index(INDEX, table_name='chat_sessions')
    with op.batch_alter_table('chat_sessions') as batch:
        batch.drop_column('request_hash')
        batch.drop_column('idempotency_key')
