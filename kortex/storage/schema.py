"""Table definitions. Every table carries ``tenant_id``; every query filters on it."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from kortex.storage.records import ACTIVE
from kortex.storage.types import BigIntPK, JSONType, UTCDateTime, UUIDStr

#: the unique index that allows a session one active turn, and its condition
ONE_ACTIVE_TURN = "uq_turns_one_active_per_session"
ACTIVE_SQL = "status IN (" + ", ".join(f"'{status}'" for status in ACTIVE) + ")"
#: the unique index of a tenant's session Idempotency-Keys, and its condition
SESSION_KEY = "uq_chat_sessions_tenant_id_idempotency_key"
KEYED_SQL = "idempotency_key IS NOT NULL"

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def _tenant(ondelete: str | None = "CASCADE") -> Column[str]:
    return Column("tenant_id", UUIDStr(), ForeignKey("tenants.id", ondelete=ondelete), nullable=False)


tenants = Table(
    "tenants",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("disabled", Boolean, nullable=False, default=False),
    Column("settings", JSONType, nullable=False, default=dict),
    Column("created_at", UTCDateTime(), nullable=False),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("key_id", String(32), nullable=False, unique=True),  # public part of the key, for lookup
    Column("secret_hash", String(64), nullable=False),          # sha256 of the secret part
    Column("name", String(200), nullable=False, default="default"),
    Column("role", String(16), nullable=False, server_default="admin"),  # kortex/access.py ROLES
    Column("created_at", UTCDateTime(), nullable=False),
    Column("revoked_at", UTCDateTime(), nullable=True),
    Index(None, "tenant_id", "created_at"),  # a tenant's keys: listed, counted, locked to revoke one
    Index(None, "revoked_at"),  # retention's oldest revoked keys; the embedded revocation epoch
)

chat_sessions = Table(
    "chat_sessions",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("name", String(200), nullable=False),
    Column("model", String(200), nullable=True),
    Column("turn_count", Integer, nullable=False, default=0),  # usage is summed from its turns
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    # The Idempotency-Key a POST /v1/sessions came with, and its body's hash
    # (kortex/turns/chat.py, new_session): a retry whose answer was lost learns its session.
    Column("idempotency_key", String(200), nullable=True),
    Column("request_hash", String(64), nullable=True),
    Index(None, "tenant_id", "created_at"),
    # One session per key and tenant: of two racing requests with one key, the second's insert
    # fails here and it answers the first's session. Only keyed rows: most sessions have none.
    Index(SESSION_KEY, "tenant_id", "idempotency_key", unique=True,
          postgresql_where=text(KEYED_SQL), sqlite_where=text(KEYED_SQL)),
)

turns = Table(
    "turns",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("session_id", UUIDStr(), ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False),
    Column("turn_no", Integer, nullable=False),
    # queued -> running -> (waiting_tools -> queued -> running)* -> done | failed
    Column("status", String(20), nullable=False),
    Column("step", Integer, nullable=False, default=0),
    # Each claim of a step bumps attempt; the running attempt holds a lease it renews while it
    # streams. A step whose worker died is claimed again once the lease lapses, and the old
    # attempt's late writes are refused (they name an attempt that is no longer current).
    Column("attempt", Integer, nullable=False, default=0, server_default="0"),
    Column("lease_until", UTCDateTime(), nullable=True),
    Column("pending_tools", Integer, nullable=False, default=0),
    Column("model", String(200), nullable=True),       # what the caller asked for
    Column("model_used", String(200), nullable=True),  # provider:model that answered last
    Column("idempotency_key", String(200), nullable=True),
    Column("request_hash", String(64), nullable=True),
    Column("error", JSONType, nullable=True),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("deadline_at", UTCDateTime(), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime(), nullable=True),
    # The stream id of the published ``done``: once the Redis stream has expired, a client that
    # reconnects with an id at or past it is told it has everything (204), not sent it all again.
    Column("done_event_id", String(48), nullable=True),
    # The kind of turn (kortex/turns/profiles.py): its prompt, tools, budget scope, finish hook.
    Column("profile", String(32), nullable=False, default="chat", server_default="chat"),
    # The W3C traceparent of the span that posted the turn (NULL with tracing off): a step the
    # watchdog hands on again joins the turn's trace (kortex/turns/watchdog.py).
    Column("traceparent", String(64), nullable=True),
    UniqueConstraint("session_id", "turn_no"),
    UniqueConstraint("tenant_id", "idempotency_key"),
    # One turn at a time per session, kept by the database: a post that loses a race to another
    # post in the same session fails its own insert (kortex/storage/posting.py), in the one
    # statement that writes the turn, with no count read after it and no transaction around it.
    Index(ONE_ACTIVE_TURN, "session_id", unique=True, postgresql_where=text(ACTIVE_SQL), sqlite_where=text(ACTIVE_SQL)),
    Index(None, "status", "updated_at"),
    Index(None, "tenant_id", "status"),
    Index(None, "status", "lease_until"),
)

chat_messages = Table(
    "chat_messages",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("session_id", UUIDStr(), ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False),
    Column("turn_id", UUIDStr(), ForeignKey("turns.id", ondelete="CASCADE"), nullable=False),
    # (turn_no, step, ord) orders a session's conversation and makes every write idempotent:
    # user message (n, -1, 0); assistant at step s (n, s, 0); result of call i at step s (n, s, i+1).
    Column("turn_no", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    Column("ord", Integer, nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=False, default=""),
    Column("tool_calls", JSONType, nullable=True),
    Column("tool_call_id", String(200), nullable=True),
    Column("tool_name", String(200), nullable=True),
    Column("result", JSONType, nullable=True),
    Column("is_error", Boolean, nullable=False, default=False),
    Column("error_code", String(40), nullable=True),
    Column("truncated", Boolean, nullable=False, default=False),
    Column("created_at", UTCDateTime(), nullable=False),
    # A final answer's citations as the server checked them (kortex/turns/grounding.py).
    Column("grounding", JSONType, nullable=True),
    UniqueConstraint("session_id", "turn_no", "step", "ord"),
    Index(None, "tenant_id", "session_id", "turn_no"),
)

tool_invocations = Table(
    "tool_invocations",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("session_id", UUIDStr(), ForeignKey("chat_sessions.id", ondelete="CASCADE"), nullable=False),
    Column("turn_id", UUIDStr(), ForeignKey("turns.id", ondelete="CASCADE"), nullable=False),
    Column("turn_no", Integer, nullable=False),
    Column("step", Integer, nullable=False),
    Column("idx", Integer, nullable=False),
    Column("call_id", String(200), nullable=False),
    Column("name", String(200), nullable=False),
    Column("arguments", JSONType, nullable=False),
    Column("arguments_error", String(500), nullable=True),
    Column("status", String(16), nullable=False),  # pending -> running -> done
    Column("is_error", Boolean, nullable=False, default=False),
    Column("error_code", String(40), nullable=True),
    Column("truncated", Boolean, nullable=False, default=False),
    Column("elapsed_ms", Integer, nullable=False, default=0),
    Column("attempts", Integer, nullable=False, default=0),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("enqueued_at", UTCDateTime(), nullable=False),  # last hand-off to the queue
    Column("started_at", UTCDateTime(), nullable=True),
    Column("deadline_at", UTCDateTime(), nullable=True),
    Column("finished_at", UTCDateTime(), nullable=True),
    # The profile of the call's turn (kortex/turns/profiles.py): the tool task runs the call
    # under that profile's policy, on its lane (a batch turn's calls stay off the chat queues).
    Column("profile", String(32), nullable=False, default="chat", server_default="chat"),
    # The traceparent of the step that made the call: a re-enqueued call, and the step a call
    # the watchdog settled hands on, stay in the turn's trace.
    Column("traceparent", String(64), nullable=True),
    UniqueConstraint("turn_id", "call_id"),
    Index(None, "status", "enqueued_at"),
)

# Append-only audit trail: one row per LLM call, tool call and proposal decision. Database
# triggers (see the migrations) reject UPDATE, and DELETE but the retention policy's of rows
# older than the cutoff it names (kortex/storage/retention.py).
decisions = Table(
    "decisions",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(ondelete=None),  # audit outlives nothing: a tenant with history is disabled, not deleted
    Column("kind", String(32), nullable=False),  # llm_call | tool_call | proposal | ...
    Column("session_id", UUIDStr(), nullable=True),
    Column("turn_id", UUIDStr(), nullable=True),
    Column("subject", String(200), nullable=False),  # tool name, provider:model, proposal action
    Column("ok", Boolean, nullable=False),
    Column("payload", JSONType, nullable=False),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("latency_ms", Integer, nullable=False, default=0),
    Column("created_at", UTCDateTime(), nullable=False),
    Index(None, "tenant_id", "created_at"),
    Index(None, "turn_id"),
)

# What each tenant's LLM calls cost per UTC day, kept beside the audit rows (in the same
# transaction) so the budget check before every LLM call reads one row, not a day of audit.
tenant_spend = Table(
    "tenant_spend",
    metadata,
    Column("tenant_id", UUIDStr(), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True),
    Column("day", Date(), primary_key=True),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("llm_calls", Integer, nullable=False, default=0),
)

# Structural stream events (tool calls and results, proposals, errors, done) that Redis refused
# when their state change committed: written in that same transaction and kept until the
# watchdog publishes them (kortex/turns/outbox.py). Empty in normal operation.
stream_outbox = Table(
    "stream_outbox",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("turn_id", UUIDStr(), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("final", Boolean, nullable=False),
    Column("events", JSONType, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Index(None, "created_at"),
    Index(None, "turn_id"),  # a claim asks whether its turn has kept events (storage/turns.py)
)

# ---- embedded telemetry store -------------------------------------------------------------

telemetry_logs = Table(
    "telemetry_logs",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("product", String(200), nullable=False),
    Column("ts", UTCDateTime(), nullable=False),
    Column("severity", Integer, nullable=False),  # 10 debug .. 50 fatal, for "at least" filters
    Column("level", String(10), nullable=False),
    Column("host", String(200), nullable=False, default=""),
    Column("message", Text, nullable=False),
    Column("trace_id", String(64), nullable=True),
    Column("attrs", JSONType, nullable=True),
    Index(None, "tenant_id", "product", "ts"),
    Index(None, "tenant_id", "trace_id"),  # get_traces(include_logs): the lines of one trace
    Index(None, "ts"),  # retention: the oldest lines of every tenant (kortex/storage/retention.py)
)

telemetry_metrics = Table(
    "telemetry_metrics",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("product", String(200), nullable=False),
    Column("metric", String(200), nullable=False),
    Column("labels", JSONType, nullable=False, default=dict),
    # The labels as ",k=v,k=v," (sorted, values percent-encoded): one series' identity, and a
    # label filter is a portable substring test on it (telemetry/embedded_metrics.py).
    Column("labels_key", Text, nullable=False, server_default=","),
    Column("ts", UTCDateTime(), nullable=False),
    Column("value", Float, nullable=False),
    Column("unit", String(32), nullable=True),
    Index(None, "tenant_id", "product", "metric", "ts"),
    Index(None, "ts"),  # retention: the oldest samples
)

telemetry_deploys = Table(
    "telemetry_deploys",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("product", String(200), nullable=False),
    Column("ts", UTCDateTime(), nullable=False),
    Column("version", String(100), nullable=False),
    Column("actor", String(200), nullable=False, default=""),
    Column("host", String(200), nullable=False, default=""),
    Column("duration_s", Float, nullable=True),
    Column("status", String(20), nullable=False, default="ok"),
    Column("commit", String(64), nullable=True),
    Column("rolled_back", Boolean, nullable=False, default=False),
    Index(None, "tenant_id", "product", "ts"),
)

telemetry_spans = Table(
    "telemetry_spans",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("trace_id", String(64), nullable=False),
    Column("span_id", String(64), nullable=False),
    Column("parent_span_id", String(64), nullable=True),
    Column("request_id", String(100), nullable=True),  # a correlation id, usually on the root span
    Column("service", String(200), nullable=False),
    Column("operation", String(200), nullable=False),
    Column("start_ts", UTCDateTime(), nullable=False),
    Column("duration_us", BigInteger, nullable=False),
    Column("status", String(10), nullable=False),  # ok | error
    Column("error_message", Text, nullable=True),
    Column("tags", JSONType, nullable=True),
    UniqueConstraint("tenant_id", "trace_id", "span_id"),  # a re-sent span is the same span
    Index(None, "tenant_id", "request_id"),
    Index(None, "start_ts"),  # retention: the oldest spans
)

# Past and open incidents: searched by get_incident_history, listed by get_active_incidents.
telemetry_incidents = Table(
    "telemetry_incidents",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("ref", String(64), nullable=False),  # the incident's own id, e.g. "INC-1042"
    Column("product", String(200), nullable=True),
    Column("title", String(500), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("opened_at", UTCDateTime(), nullable=False),
    Column("closed_at", UTCDateTime(), nullable=True),
    Column("findings", Text, nullable=False, default=""),
    Column("resolution", Text, nullable=False, default=""),
    Column("target_type", String(20), nullable=True),  # product | deployment | model | backend
    Column("target_id", String(200), nullable=True),
    UniqueConstraint("tenant_id", "ref"),
    Index(None, "tenant_id", "opened_at"),
)

# The /admin/info envelope each product last reported (get_admin_info).
telemetry_products = Table(
    "telemetry_products",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("product", String(200), nullable=False),
    Column("info", JSONType, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("tenant_id", "product"),
)

# ---- LLM-ops data (the LLM platform an operator runs: deployments, requests, users) ---------

llm_deployments = Table(
    "llm_deployments",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("deployment_id", String(200), nullable=False),  # "<model>/<backend>"
    Column("model_id", String(100), nullable=False),
    Column("backend_id", String(100), nullable=False),
    Column("status", String(16), nullable=False),  # healthy | degraded | down
    Column("latency_p50_ms", Float, nullable=True),
    Column("latency_p95_ms", Float, nullable=True),
    Column("error_rate", Float, nullable=True),
    Column("queue_depth", Integer, nullable=True),
    Column("cost_per_1k_tokens", Float, nullable=True),
    Column("rate_limit_remaining", Integer, nullable=True),
    Column("sample_count", Integer, nullable=False, default=0),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("tenant_id", "deployment_id"),
)

llm_users = Table(
    "llm_users",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("user_id", String(200), nullable=False),
    Column("tier", String(16), nullable=False),  # premium | standard | budget
    Column("latency_sla_ms", Integer, nullable=True),
    Column("daily_budget_usd", Float, nullable=True),
    UniqueConstraint("tenant_id", "user_id"),
)

llm_requests = Table(
    "llm_requests",
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    _tenant(),
    Column("request_id", String(100), nullable=False),
    Column("user_id", String(200), nullable=False),
    Column("user_tier", String(16), nullable=False),
    Column("deployment_id", String(200), nullable=False),
    Column("model_id", String(100), nullable=False),
    Column("backend_id", String(100), nullable=False),
    Column("task_type", String(50), nullable=False, default=""),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("latency_ms", Integer, nullable=False),
    Column("status", String(16), nullable=False),  # success | error | timeout
    Column("quality_score", Float, nullable=True),
    Column("router_version", String(50), nullable=True),
    Column("experiment_id", String(100), nullable=True),
    Column("routing", JSONType, nullable=True),  # the routing decision: options considered, choice
    Column("created_at", UTCDateTime(), nullable=False),
    UniqueConstraint("tenant_id", "request_id"),
    Index(None, "tenant_id", "created_at"),
    Index(None, "tenant_id", "user_id", "created_at"),
)

# ---- proposals ----------------------------------------------------------------------------

# A remediation a model proposed (propose_action). Nothing runs until an operator of the same
# tenant confirms it; it expires otherwise. Decisions are compare-and-set on ``status``.
proposals = Table(
    "proposals",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("session_id", UUIDStr(), nullable=True),
    Column("turn_id", UUIDStr(), nullable=True),
    Column("call_id", String(200), nullable=True),
    Column("action", String(64), nullable=False),
    Column("product", String(200), nullable=False),
    Column("params", JSONType, nullable=False),
    Column("rationale", Text, nullable=False),
    Column("blast_radius", String(200), nullable=True),
    Column("reversible", Boolean, nullable=True),
    Column("status", String(16), nullable=False),  # pending -> confirmed | rejected | expired
    Column("created_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    Column("decided_at", UTCDateTime(), nullable=True),
    Column("decided_by", String(200), nullable=True),
    Column("note", String(1000), nullable=True),
    Column("execution_status", String(16), nullable=True),  # confirmed: pending -> recorded | done | failed
    Column("execution", JSONType, nullable=True),
    Column("executed_at", UTCDateTime(), nullable=True),
    # Executor runs started (the first at confirmation, at most one retry by the watchdog) and
    # when the last one started: an execution left pending past a grace period was interrupted.
    Column("execution_attempts", Integer, nullable=False, default=0, server_default="0"),
    Column("execution_started_at", UTCDateTime(), nullable=True),
    UniqueConstraint("tenant_id", "turn_id", "call_id"),  # a re-run tool call finds its proposal
    Index(None, "tenant_id", "status", "expires_at"),
    Index(None, "tenant_id", "session_id"),
    Index(None, "status", "expires_at"),  # the watchdog's expiry sweep, across tenants
    Index(None, "execution_status", "execution_started_at"),  # the watchdog's execution recovery
)

# ---- post-mortem jobs (kortex/postmortems/) --------------------------------------------------

# A batch of incidents to write post-mortems for. Its counts are read from its items; ``status``
# moves queued -> running -> done | cancelled (failed only when no item could even start).
postmortem_jobs = Table(
    "postmortem_jobs",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("status", String(16), nullable=False),
    Column("selection", JSONType, nullable=False),  # the ids or filter it was asked for, as given
    Column("model", String(200), nullable=True),
    Column("max_usd", Float, nullable=True),
    Column("concurrency", Integer, nullable=False),
    Column("template", String(64), nullable=True),
    Column("force", Boolean, nullable=False, default=False),
    Column("idempotency_key", String(200), nullable=True),
    Column("request_hash", String(64), nullable=True),
    Column("session_id", UUIDStr(), ForeignKey("chat_sessions.id", ondelete="SET NULL"), nullable=True),
    Column("created_by", String(64), nullable=True),  # a key id, never a secret
    # The job's last progress event (postmortem_events.seq): bumped under the job's row lock,
    # so events commit in the order of their numbers and a feed resumed after n misses none.
    Column("seq", Integer, nullable=False, default=0, server_default="0"),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("finished_at", UTCDateTime(), nullable=True),
    UniqueConstraint("tenant_id", "idempotency_key"),
    Index(None, "tenant_id", "created_at"),
    Index(None, "status"),
)

# One incident of a job: queued -> dispatched -> running -> done | failed | skipped | cancelled.
# ``dispatched`` means its task was handed to the batch queue (the watchdog re-sends one that
# sat there too long); ``running`` means its investigation turn exists.
postmortem_items = Table(
    "postmortem_items",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("job_id", UUIDStr(), ForeignKey("postmortem_jobs.id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),
    Column("incident_ref", String(64), nullable=False),
    Column("incident", JSONType, nullable=False),  # the incident as it was when the job was made
    Column("status", String(16), nullable=False),
    Column("turn_id", UUIDStr(), nullable=True, unique=True),
    Column("error", JSONType, nullable=True),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("dispatched_at", UTCDateTime(), nullable=True),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("finished_at", UTCDateTime(), nullable=True),
    UniqueConstraint("job_id", "incident_ref"),
    Index(None, "job_id", "status", "position"),
    Index(None, "status", "dispatched_at"),
    # The tenant's open or active items across its jobs (its caps, and the incidents in progress),
    # status first: led by tenant_id, SQLite took it for a job's own item queries (migration 0016).
    Index(None, "status", "tenant_id"),
)

# A job's progress, one row per item move and one when the job ends (the SSE feed reads it).
postmortem_events = Table(
    "postmortem_events",
    metadata,
    Column("job_id", UUIDStr(), ForeignKey("postmortem_jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    _tenant(),
    Column("kind", String(32), nullable=False),  # item_started | item_<status> | job_<status>
    Column("item_id", UUIDStr(), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
)

# A validated post-mortem (kortex/postmortems/document.py). One per item, ever: a re-run item
# or a re-delivered hook finds it there. The latest per incident is what the API serves.
postmortems = Table(
    "postmortems",
    metadata,
    Column("id", UUIDStr(), primary_key=True),
    _tenant(),
    Column("item_id", UUIDStr(), ForeignKey("postmortem_items.id", ondelete="SET NULL"), nullable=True,
           unique=True),
    Column("job_id", UUIDStr(), nullable=True),
    Column("turn_id", UUIDStr(), nullable=True),
    Column("incident_ref", String(64), nullable=False),
    Column("document", JSONType, nullable=False),
    Column("grounding", JSONType, nullable=True),  # its citations as the server checked them
    Column("created_at", UTCDateTime(), nullable=False),
    Index(None, "tenant_id", "incident_ref", "created_at"),
    Index(None, "job_id", "incident_ref"),  # a job's documents in incident order, a page at a time
)

TENANT_TABLES = tuple(t for t in metadata.sorted_tables if "tenant_id" in t.c)
