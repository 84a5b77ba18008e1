"""retention (kortex/storage/retention.py): an index on the time of the telemetry tables none of
whose indexes gave their oldest rows (logs and metric samples: led by tenant and product; spans:
none on their time at all); and on PostgreSQL the audit trail's trigger lets a transaction that
names a cutoff delete the rows older than it, and nothing else

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

# A DELETE is let through only for a row older than the transaction-local setting the pruning
# sets (SET LOCAL, so it ends with its transaction), and only when that cutoff is at least 31 days
# back (the least audit_days takes: the database holds the floor too, not only the settings); an
# UPDATE, or a DELETE anywhere else, is refused as before. (NULLIF: once a SET LOCAL has ended, the
# setting reads '' in that session.)
# SQLite keeps its trigger: the pruning drops and recreates it inside its own transaction there,
# which the one writer SQLite allows makes invisible to every other connection.
_PG_PRUNABLE = """
CREATE OR REPLACE FUNCTION kortex_decisions_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND OLD.created_at < NULLIF(current_setting('kortex.prune_audit_before', true), '')::timestamptz
       AND NULLIF(current_setting('kortex.prune_audit_before', true), '')::timestamptz
           <= now() - interval '31 days' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'decisions is append-only';
END;
$$ LANGUAGE plpgsql;
"""

_PG_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION kortex_decisions_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'decisions is append-only';
END;
$$ LANGUAGE plpgsql;
"""


def upgrade() -> None:
    # On the time alone, not (tenant_id, time): SQLite's planner took (tenant_id, ts) over
    # (tenant_id, trace_id) for one trace's log lines. Pruning needs no tenant: the oldest go first.
    op.create_index(op.f('ix_telemetry_logs_ts'), 'telemetry_logs', ['ts'], unique=False)
    op.create_index(op.f('ix_telemetry_metrics_ts'), 'telemetry_metrics', ['ts'], unique=False)
    op.create_index(op.f('ix_telemetry_spans_start_ts'), 'telemetry_spans', ['start_ts'], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_PRUNABLE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_APPEND_ONLY)
    op.drop_index(op.f('ix_telemetry_spans_start_ts'), table_name='telemetry_spans')
    op.drop_index(op.f('ix_telemetry_metrics_ts'), table_name='telemetry_metrics')
    op.drop_index(op.f('ix_telemetry_logs_ts'), table_name='telemetry_logs')
