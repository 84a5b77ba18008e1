"""post-mortem jobs, their items and documents; tool_invocations.profile (a call runs under its
turn's profile, on its lane)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import kortex.storage.types as kt

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('postmortem_jobs',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('selection', kt.JSONType, nullable=False),
    sa.Column('model', sa.String(length=200), nullable=True),
    sa.Column('max_usd', sa.Float(), nullable=True),
    sa.Column('concurrency', sa.Integer(), nullable=False),
    sa.Column('template', sa.String(length=64), nullable=True),
    sa.Column('force', sa.Boolean(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('request_hash', sa.String(length=64), nullable=True),
    sa.Column('session_id', kt.UUIDStr(), nullable=True),
    sa.Column('created_by', sa.String(length=64), nullable=True),
    sa.Column('seq', sa.Integer(), server_default='0', nullable=False),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.Column('started_at', kt.UTCDateTime(), nullable=True),
    sa.Column('finished_at', kt.UTCDateTime(), nullable=True),
    sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], name=op.f('fk_postmortem_jobs_session_id_chat_sessions'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_postmortem_jobs_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_postmortem_jobs')),
    sa.UniqueConstraint('tenant_id', 'idempotency_key', name=op.f('uq_postmortem_jobs_tenant_id_idempotency_key'))
    )
    with op.batch_alter_table('postmortem_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_postmortem_jobs_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_postmortem_jobs_tenant_id_created_at'), ['tenant_id', 'created_at'], unique=False)

    op.create_table('postmortem_items',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('job_id', kt.UUIDStr(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('incident_ref', sa.String(length=64), nullable=False),
    sa.Column('incident', kt.JSONType, nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('turn_id', kt.UUIDStr(), nullable=True),
    sa.Column('error', kt.JSONType, nullable=True),
    sa.Column('cost_usd', sa.Float(), nullable=False),
    sa.Column('dispatched_at', kt.UTCDateTime(), nullable=True),
    sa.Column('started_at', kt.UTCDateTime(), nullable=True),
    sa.Column('finished_at', kt.UTCDateTime(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['postmortem_jobs.id'], name=op.f('fk_postmortem_items_job_id_postmortem_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_postmortem_items_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_postmortem_items')),
    sa.UniqueConstraint('job_id', 'incident_ref', name=op.f('uq_postmortem_items_job_id_incident_ref')),
    sa.UniqueConstraint('turn_id', name=op.f('uq_postmortem_items_turn_id'))
    )
    with op.batch_alter_table('postmortem_items', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_postmortem_items_job_id_status_position'), ['job_id', 'status', 'position'], unique=False)
        batch_op.create_index(batch_op.f('ix_postmortem_items_status_dispatched_at'), ['status', 'dispatched_at'], unique=False)

    op.create_table('postmortem_events',
    sa.Column('job_id', kt.UUIDStr(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('item_id', kt.UUIDStr(), nullable=True),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['postmortem_jobs.id'], name=op.f('fk_postmortem_events_job_id_postmortem_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_postmortem_events_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'seq', name=op.f('pk_postmortem_events'))
    )
    op.create_table('postmortems',
    sa.Column('id', kt.UUIDStr(), nullable=False),
    sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
    sa.Column('item_id', kt.UUIDStr(), nullable=True),
    sa.Column('job_id', kt.UUIDStr(), nullable=True),
    sa.Column('turn_id', kt.UUIDStr(), nullable=True),
    sa.Column('incident_ref', sa.String(length=64), nullable=False),
    sa.Column('document', kt.JSONType, nullable=False),
    sa.Column('grounding', kt.JSONType, nullable=True),
    sa.Column('created_at', kt.UTCDateTime(), nullable=False),
    sa.ForeignKeyConstraint(['item_id'], ['postmortem_items.id'], name=op.f('fk_postmortems_item_id_postmortem_items'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_postmortems_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_postmortems')),
    sa.UniqueConstraint('item_id', name=op.f('uq_postmortems_item_id'))
    )
    with op.batch_alter_table('postmortems', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_postmortems_tenant_id_incident_ref_created_at'), ['tenant_id', 'incident_ref', 'created_at'], unique=False)

    with op.batch_alter_table('tool_invocations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('profile', sa.String(length=32), server_default='chat', nullable=False))



def downgrade() -> None:
    with op.batch_alter_table('tool_invocations', schema=None) as batch_op:
        batch_op.drop_column('profile')

    with op.batch_alter_table('postmortems', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_postmortems_tenant_id_incident_ref_created_at'))

    op.drop_table('postmortems')
    with op.batch_alter_table('postmortem_items', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_postmortem_items_status_dispatched_at'))
        batch_op.drop_index(batch_op.f('ix_postmortem_items_job_id_status_position'))

    op.drop_table('postmortem_events')
    op.drop_table('postmortem_items')
    with op.batch_alter_table('postmortem_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_postmortem_jobs_tenant_id_created_at'))
        batch_op.drop_index(batch_op.f('ix_postmortem_jobs_status'))

    op.drop_table('postmortem_jobs')
