"""tenant spend: what each tenant's LLM calls cost per UTC day (read by the budget check)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import kortex.storage.types as kt

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tenant_spend',
        sa.Column('tenant_id', kt.UUIDStr(), nullable=False),
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('cost_usd', sa.Float(), nullable=False),
        sa.Column('llm_calls', sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_tenant_spend_tenant_id_tenants'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('tenant_id', 'day', name=op.f('pk_tenant_spend')),
    )
    # what was spent before this table existed (timestamps are UTC on both databases)
    day = "date(created_at)" if op.get_bind().dialect.name == "sqlite" else "(created_at AT TIME ZONE 'UTC')::date"
    op.execute(
        f"INSERT INTO tenant_spend (tenant_id, day, cost_usd, llm_calls) "
        f"SELECT tenant_id, {day}, SUM(cost_usd), COUNT(*) FROM decisions "
        f"WHERE kind = 'llm_call' GROUP BY tenant_id, {day}"
    )


def downgrade() -> None:
    op.drop_table('tenant_spend')
