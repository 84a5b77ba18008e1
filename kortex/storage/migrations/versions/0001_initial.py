"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import kortex.storage.types as kt

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


_PG_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION kortex_decisions_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'decisions is append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER decisions_append_only BEFORE UPDATE OR DELETE ON decisions
    FOR EACH ROW EXECUTE FUNCTION kortex_decisions_append_only();
"""


def _append_only() -> None:
    """The audit trail rejects UPDATE and DELETE at the database, not only in our code."""
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(_PG_APPEND_ONLY)
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER decisions_no_{verb.lower()} BEFORE {verb} ON decisions "
                "BEGIN SELECT RAISE(ABORT, 'decisions is append-only'); END"
            )


def upgrade() -> None:
    op.create_table('tenants',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('disabled', sa.Boolean(), nullable=False),
    sa.Column('settings', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tenants')),
    sa.UniqueConstraint('name', name=op.f('uq_tenants_name'))
    )
    op.create_table('api_keys',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('secret_hash', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.Column('revoked_at', kt.UTCDateTime(), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_api_keys_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_id', name=op.f('uq_api_keys_key_id'))
    )
    op.create_table('chat_sessions',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=True),
    sa.Column('turn_count', sa.Integer(), nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.Column('updated_at', kt.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_chat_sessions_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_chat_sessions'))
    )
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_chat_sessions_tenant_id_created_at'), ['tenant_id', 'created_at'], unique=False)

    op.create_table('decisions',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('session_id', kt.UUIDStr(), nullable=True),
    sa.Column('turn_id', kt.UUIDStr(), nullable=True),
    sa.Column('subject', sa.String(length=200), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('payload', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('input_tokens', sa.Integer(), nullable=False),
    sa.Column('output_tokens', sa.Integer(), nullable=False),
    sa.Column('cost_usd', sa.Float(), nullable=False),
    sa.Column('latency_ms', sa.Integer(), nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_decisions_tenant_id_tenants')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_decisions'))
    )
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_decisions_tenant_id_created_at'), ['tenant_id', 'created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_decisions_turn_id'), ['turn_id'], unique=False)

    op.create_table('telemetry_deploys',
    sa.Column('id', kt.BigIntPK, autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('product', sa.String(length=200), nullable=False),
    sa.Column('ts', kt.UTCDateTime(), nullable=False),
    sa.Column('version', sa.String(length=100), nullable=False),
    sa.Column('actor', sa.String(length=200), nullable=False),
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('commit', sa.String(length=64), nullable=True),
    sa.Column('rolled_back', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_telemetry_deploys_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_telemetry_deploys'))
    )
    with op.batch_alter_table('telemetry_deploys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_telemetry_deploys_tenant_id_product_ts'), ['tenant_id', 'product', 'ts'], unique=False)

    op.create_table('telemetry_logs',
    sa.Column('id', kt.BigIntPK, autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('product', sa.String(length=200), nullable=False),
    sa.Column('ts', kt.UTCDateTime(), nullable=False),
    sa.Column('severity', sa.Integer(), nullable=False),
    sa.Column('level', sa.String(length=10), nullable=False),
    sa.Column('host', sa.String(length=200), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('trace_id', sa.String(length=64), nullable=True),
    sa.Column('attrs', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_telemetry_logs_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_telemetry_logs'))
    )
    with op.batch_alter_table('telemetry_logs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_telemetry_logs_tenant_id_product_ts'), ['tenant_id', 'product', 'ts'], unique=False)

    op.create_table('telemetry_metrics',
    sa.Column('id', kt.BigIntPK, autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('product', sa.String(length=200), nullable=False),
    sa.Column('metric', sa.String(length=200), nullable=False),
    sa.Column('labels', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('ts', kt.UTCDateTime(), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('unit', sa.String(length=32), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_telemetry_metrics_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_telemetry_metrics'))
    )
    with op.batch_alter_table('telemetry_metrics', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_telemetry_metrics_tenant_id_product_metric_ts'), ['tenant_id', 'product', 'metric', 'ts'], unique=False)

    op.create_table('turns',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('session_id', kt.UUIDStr(), nullable=False),
    sa.Column('turn_no', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('pending_tools', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=True),
    sa.Column('model_used', sa.String(length=200), nullable=True),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('request_hash', sa.String(length=64), nullable=True),
    sa.Column('error', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('input_tokens', sa.Integer(), nullable=False),
    sa.Column('output_tokens', sa.Integer(), nullable=False),
    sa.Column('cost_usd', sa.Float(), nullable=False),
    sa.Column('deadline_at', kt.UTCDateTime(), nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.Column('updated_at', kt.UTCDateTime(), nullable=False),
    sa.Column('finished_at', kt.UTCDateTime(), nullable=True),
    sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], name=op.f('fk_turns_session_id_chat_sessions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_turns_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_turns')),
    sa.UniqueConstraint('session_id', 'turn_no', name=op.f('uq_turns_session_id_turn_no')),
    sa.UniqueConstraint('tenant_id', 'idempotency_key', name=op.f('uq_turns_tenant_id_idempotency_key'))
    )
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_turns_status_updated_at'), ['status', 'updated_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_turns_tenant_id_status'), ['tenant_id', 'status'], unique=False)

    op.create_table('chat_messages',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('session_id', kt.UUIDStr(), nullable=False),
    sa.Column('turn_id', kt.UUIDStr(), nullable=False),
    sa.Column('turn_no', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('ord', sa.Integer(), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('tool_calls', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('tool_call_id', sa.String(length=200), nullable=True),
    sa.Column('tool_name', sa.String(length=200), nullable=True),
    sa.Column('result', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('is_error', sa.Boolean(), nullable=False),
    sa.Column('error_code', sa.String(length=40), nullable=True),
    sa.Column('truncated', sa.Boolean(), nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], name=op.f('fk_chat_messages_session_id_chat_sessions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_chat_messages_tenant_id_tenants'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['turn_id'], ['turns.id'], name=op.f('fk_chat_messages_turn_id_turns'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_chat_messages')),
    sa.UniqueConstraint('session_id', 'turn_no', 'step', 'ord', name=op.f('uq_chat_messages_session_id_turn_no_step_ord'))
    )
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_chat_messages_tenant_id_session_id_turn_no'), ['tenant_id', 'session_id', 'turn_no'], unique=False)

    op.create_table('tool_invocations',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('session_id', kt.UUIDStr(), nullable=False),
    sa.Column('turn_id', kt.UUIDStr(), nullable=False),
    sa.Column('turn_no', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('idx', sa.Integer(), nullable=False),
    sa.Column('call_id', sa.String(length=200), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('arguments', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('arguments_error', sa.String(length=500), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('is_error', sa.Boolean(), nullable=False),
    sa.Column('error_code', sa.String(length=40), nullable=True),
    sa.Column('truncated', sa.Boolean(), nullable=False),
    sa.Column('elapsed_ms', sa.Integer(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.Column('enqueued_at', kt.UTCDateTime(), nullable=False),
    sa.Column('started_at', kt.UTCDateTime(), nullable=True),
    sa.Column('deadline_at', kt.UTCDateTime(), nullable=True),
    sa.Column('finished_at', kt.UTCDateTime(), nullable=True),
    sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], name=op.f('fk_tool_invocations_session_id_chat_sessions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_tool_invocations_tenant_id_tenants'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['turn_id'], ['turns.id'], name=op.f('fk_tool_invocations_turn_id_turns'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tool_invocations')),
    sa.UniqueConstraint('turn_id', 'call_id', name=op.f('uq_tool_invocations_turn_id_call_id'))
    )
    with op.batch_alter_table('tool_invocations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tool_invocations_status_enqueued_at'), ['status', 'enqueued_at'], unique=False)
    _append_only()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS decisions_append_only ON decisions")
        op.execute("DROP FUNCTION IF EXISTS kortex_decisions_append_only()")
    with op.batch_alter_table('tool_invocations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tool_invocations_status_enqueued_at'))

    op.drop_table('tool_invocations')
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_chat_messages_tenant_id_session_id_turn_no'))

    op.drop_table('chat_messages')
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_turns_tenant_id_status'))
        batch_op.drop_index(batch_op.f('ix_turns_status_updated_at'))

    op.drop_table('turns')
    with op.batch_alter_table('telemetry_metrics', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_telemetry_metrics_tenant_id_product_metric_ts'))

    op.drop_table('telemetry_metrics')
    with op.batch_alter_table('telemetry_logs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_telemetry_logs_tenant_id_product_ts'))

    op.drop_table('telemetry_logs')
    with op.batch_alter_table('telemetry_deploys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_telemetry_deploys_tenant_id_product_ts'))

    op.drop_table('telemetry_deploys')
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_decisions_turn_id'))
        batch_op.drop_index(batch_op.f('ix_decisions_tenant_id_created_at'))

    op.drop_table('decisions')
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_chat_sessions_tenant_id_created_at'))

    op.drop_table('chat_sessions')
    op.drop_table('api_keys')
    op.drop_table('tenants')
