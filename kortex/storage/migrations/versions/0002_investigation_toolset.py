"""investigation toolset: spans, incidents, product info, LLM-ops data, proposals

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import kortex.storage.types as kt

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('llm_deployments',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('deployment_id', sa.String(length=200), nullable=False),
    sa.Column('model_id', sa.String(length=100), nullable=False),
    sa.Column('backend_id', sa.String(length=100), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('latency_p50_ms', sa.Float(), nullable=True),
    sa.Column('latency_p95_ms', sa.Float(), nullable=True),
    sa.Column('error_rate', sa.Float(), nullable=True),
    sa.Column('queue_depth', sa.Integer(), nullable=True),
    sa.Column('cost_per_1k_tokens', sa.Float(), nullable=True),
    sa.Column('rate_limit_remaining', sa.Integer(), nullable=True),
    sa.Column('sample_count', sa.Integer(), nullable=False),
    sa.Column('updated_at', kt.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_llm_deployments_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_llm_deployments')),
    sa.UniqueConstraint('tenant_id', 'deployment_id', name=op.f('uq_llm_deployments_tenant_id_deployment_id'))
    )
    op.create_table('llm_requests',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('request_id', sa.String(length=100), nullable=False),
    sa.Column('user_id', sa.String(length=200), nullable=False),
    sa.Column('user_tier', sa.String(length=16), nullable=False),
    sa.Column('deployment_id', sa.String(length=200), nullable=False),
    sa.Column('model_id', sa.String(length=100), nullable=False),
    sa.Column('backend_id', sa.String(length=100), nullable=False),
    sa.Column('task_type', sa.String(length=50), nullable=False),
    sa.Column('input_tokens', sa.Integer(), nullable=False),
    sa.Column('output_tokens', sa.Integer(), nullable=False),
    sa.Column('cost_usd', sa.Float(), nullable=False),
    sa.Column('latency_ms', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('quality_score', sa.Float(), nullable=True),
    sa.Column('router_version', sa.String(length=50), nullable=True),
    sa.Column('experiment_id', sa.String(length=100), nullable=True),
    sa.Column('routing', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_llm_requests_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_llm_requests')),
    sa.UniqueConstraint('tenant_id', 'request_id', name=op.f('uq_llm_requests_tenant_id_request_id'))
    )
    with op.batch_alter_table('llm_requests', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_llm_requests_tenant_id_created_at'), ['tenant_id', 'created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_llm_requests_tenant_id_user_id_created_at'), ['tenant_id', 'user_id', 'created_at'], unique=False)

    op.create_table('llm_users',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('user_id', sa.String(length=200), nullable=False),
    sa.Column('tier', sa.String(length=16), nullable=False),
    sa.Column('latency_sla_ms', sa.Integer(), nullable=True),
    sa.Column('daily_budget_usd', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_llm_users_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_llm_users')),
    sa.UniqueConstraint('tenant_id', 'user_id', name=op.f('uq_llm_users_tenant_id_user_id'))
    )
    op.create_table('proposals',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('session_id', kt.UUIDStr(), nullable=True),
    sa.Column('turn_id', kt.UUIDStr(), nullable=True),
    sa.Column('call_id', sa.String(length=200), nullable=True),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('product', sa.String(length=200), nullable=False),
    sa.Column('params', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('rationale', sa.Text(), nullable=False),
    sa.Column('blast_radius', sa.String(length=200), nullable=True),
    sa.Column('reversible', sa.Boolean(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.Column('expires_at', kt.UTCDateTime(), nullable=False),
    sa.Column('decided_at', kt.UTCDateTime(), nullable=True),
    sa.Column('decided_by', sa.String(length=200), nullable=True),
    sa.Column('note', sa.String(length=1000), nullable=True),
    sa.Column('execution_status', sa.String(length=16), nullable=True),
    sa.Column('execution', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('executed_at', kt.UTCDateTime(), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_proposals_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_proposals')),
    sa.UniqueConstraint('tenant_id', 'turn_id', 'call_id', name=op.f('uq_proposals_tenant_id_turn_id_call_id'))
    )
    with op.batch_alter_table('proposals', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_proposals_tenant_id_session_id'), ['tenant_id', 'session_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_proposals_tenant_id_status_expires_at'), ['tenant_id', 'status', 'expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_proposals_status_expires_at'), ['status', 'expires_at'], unique=False)

    op.create_table('telemetry_incidents',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('ref', sa.String(length=64), nullable=False),
    sa.Column('product', sa.String(length=200), nullable=True),
    sa.Column('title', sa.String(length=500), nullable=False),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('opened_at', kt.UTCDateTime(), nullable=False),
    sa.Column('closed_at', kt.UTCDateTime(), nullable=True),
    sa.Column('findings', sa.Text(), nullable=False),
    sa.Column('resolution', sa.Text(), nullable=False),
    sa.Column('target_type', sa.String(length=20), nullable=True),
    sa.Column('target_id', sa.String(length=200), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_telemetry_incidents_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_telemetry_incidents')),
    sa.UniqueConstraint('tenant_id', 'ref', name=op.f('uq_telemetry_incidents_tenant_id_ref'))
    )
    with op.batch_alter_table('telemetry_incidents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_telemetry_incidents_tenant_id_opened_at'), ['tenant_id', 'opened_at'], unique=False)

    op.create_table('telemetry_products',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('product', sa.String(length=200), nullable=False),
    sa.Column('info', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('updated_at', kt.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_telemetry_products_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_telemetry_products')),
    sa.UniqueConstraint('tenant_id', 'product', name=op.f('uq_telemetry_products_tenant_id_product'))
    )
    op.create_table('telemetry_spans',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('trace_id', sa.String(length=64), nullable=False),
    sa.Column('span_id', sa.String(length=64), nullable=False),
    sa.Column('parent_span_id', sa.String(length=64), nullable=True),
    sa.Column('request_id', sa.String(length=100), nullable=True),
    sa.Column('service', sa.String(length=200), nullable=False),
    sa.Column('operation', sa.String(length=200), nullable=False),
    sa.Column('start_ts', kt.UTCDateTime(), nullable=False),
    sa.Column('duration_us', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=10), nullable=False),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('tags', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_telemetry_spans_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_telemetry_spans')),
    sa.UniqueConstraint('tenant_id', 'trace_id', 'span_id', name=op.f('uq_telemetry_spans_tenant_id_trace_id_span_id'))
    )
    with op.batch_alter_table('telemetry_spans', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_telemetry_spans_tenant_id_request_id'), ['tenant_id', 'request_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('telemetry_spans', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_telemetry_spans_tenant_id_request_id'))

    op.drop_table('telemetry_spans')
    op.drop_table('telemetry_products')
    with op.batch_alter_table('telemetry_incidents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_telemetry_incidents_tenant_id_opened_at'))

    op.drop_table('telemetry_incidents')
    with op.batch_alter_table('proposals', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_proposals_status_expires_at'))
        batch_op.drop_index(batch_op.f('ix_proposals_tenant_id_status_expires_at'))
        batch_op.drop_index(batch_op.f('ix_proposals_tenant_id_session_id'))

    op.drop_table('proposals')
    op.drop_table('llm_users')
    with op.batch_alter_table('llm_requests', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_llm_requests_tenant_id_user_id_created_at'))
        batch_op.drop_index(batch_op.f('ix_llm_requests_tenant_id_created_at'))

    op.drop_table('llm_requests')
    op.drop_table('llm_deployments')
