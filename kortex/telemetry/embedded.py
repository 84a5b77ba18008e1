"""The embedded telemetry store: telemetry tables in Kortex's own database, tenant-scoped.

Every statement filters on ``tenant_id`` first and is bounded by a LIMIT."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, Integer, and_, case, cast, func, literal, not_, or_, select, tuple_
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import Function

from kortex.errors import InvalidInput, StorageError
from kortex.regex import SQLITE_FUNCTION, SQLITE_ICONTAINS, anchored
from kortex.storage.db import Database
from kortex.storage.schema import (
    telemetry_deploys,
    telemetry_incidents,
    telemetry_logs,
    telemetry_metrics,
    telemetry_products,
    telemetry_spans,
)
from kortex.telemetry.embedded_llmops import EmbeddedLLMOps
from kortex.telemetry.embedded_metrics import EmbeddedMetrics
from kortex.telemetry.logql import LogFilter, postgres_pattern
from kortex.telemetry.sources import (
    LEVELS,
    MAX_LOG_PAGE,
    MAX_TRACE_SPANS,
    Deploy,
    Incident,
    IncidentHit,
    IncidentPage,
    IncidentQuery,
    LogLine,
    LogPage,
    LogQuery,
    ProductSeen,
    Span,
    TelemetrySources,
    Trace,
)

INVALID_REGEX = "2201B"  # PostgreSQL's SQLSTATE for a pattern its engine rejects
MAX_TOKENS = 12
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_WORD = re.compile(r"[a-z0-9][a-z0-9._/-]*")
_STOP = frozenset("a an and are as at be by for from has have in is it of on or that the this to was were "
                  "with why what how when".split())


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE behind a StorageError (PostgreSQL), if any."""
    orig = getattr(exc.__cause__, "orig", None)
    return getattr(orig, "sqlstate", None)


def like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def search_tokens(text: str) -> list[str]:
    """The words a free-text search looks for: lower case, no stop words, at most 12."""
    words = [w.strip("._/-") for w in _WORD.findall(text.lower())]
    out: list[str] = []
    for word in words:
        if len(word) >= 2 and word not in _STOP and word not in out:
            out.append(word)
    return out[:MAX_TOKENS]


class EmbeddedTelemetry:
    """Implements every source interface over the ``telemetry_*`` and ``llm_*`` tables."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.llmops = EmbeddedLLMOps(db)
        self.metrics = EmbeddedMetrics(db)

    def close(self) -> None:
        self.db.dispose()

    # ---- logs ------------------------------------------------------------------------------

    def _contains(self, column: Any, text: str) -> ColumnElement[bool]:
        # Case-sensitive substring, as LogQL's |= is (LIKE ignores case on SQLite).
        if self.db.is_sqlite:
            return func.instr(column, text) > 0
        return func.strpos(column, text) > 0

    def _matches(self, column: ColumnElement[Any], pattern: str) -> ColumnElement[bool]:
        # SQLite: RE2 through our own SQL function (linear time, so the statement timeout's
        # progress handler gets control between rows). PostgreSQL: its own engine, bounded by
        # statement_timeout; patterns it rejects become validation errors (query_logs).
        if self.db.is_sqlite:
            return Function(SQLITE_FUNCTION, pattern, column) == 1  # what func.<name>(...) builds
        return column.regexp_match(postgres_pattern(pattern))

    def _log_filter(self, flt: LogFilter) -> list[ColumnElement[bool]]:
        t = telemetry_logs
        where: list[ColumnElement[bool]] = []
        if flt.plain is not None:
            if self.db.is_sqlite and not flt.plain.isascii():
                # SQLite's LIKE folds ASCII letters only: "échec" would miss "ÉCHEC". An ASCII
                # text keeps LIKE, in C and several times faster than a Python function per row.
                where.append(Function(SQLITE_ICONTAINS, flt.plain, t.c.message) == 1)
            else:
                where.append(t.c.message.ilike(f"%{like_escape(flt.plain)}%", escape="\\"))
        for m in flt.matchers:
            value = func.coalesce(t.c[m.label], "")  # LogQL: a missing label is the empty string
            if m.op == "=":
                where.append(value == m.value)
            elif m.op == "!=":
                where.append(value != m.value)
            else:
                matched = self._matches(value, anchored(m.value))
                where.append(matched if m.op == "=~" else not_(matched))
        for line in flt.lines:
            cond = self._matches(t.c.message, line.value) if line.regex else self._contains(t.c.message, line.value)
            where.append(not_(cond) if line.negated else cond)
        return where

    def query_logs(self, tenant_id: str, query: LogQuery) -> LogPage:
        t = telemetry_logs
        limit = max(1, min(query.limit, MAX_LOG_PAGE))
        where: list[Any] = [t.c.tenant_id == tenant_id, t.c.ts >= query.start, t.c.ts < query.end]
        if query.product is not None:
            where.append(t.c.product == query.product)
        if query.trace_id is not None:
            where.append(t.c.trace_id == query.trace_id)
        if query.product is None and query.trace_id is None:
            raise InvalidInput("a log query needs a product or a trace id")
        if query.min_level:
            where.append(t.c.severity >= LEVELS[query.min_level])
        if query.filter is not None:
            where.extend(self._log_filter(query.filter))
        page_where = list(where)
        if query.before is not None:
            page_where.append(tuple_(t.c.ts, t.c.id) < tuple_(*query.before))
        try:
            with self.db.connect() as conn:
                total = int(conn.scalar(select(func.count()).select_from(t).where(*where)) or 0)
                rows = conn.execute(
                    select(t.c.id, t.c.ts, t.c.level, t.c.host, t.c.message, t.c.trace_id, t.c.product)
                    .where(*page_where)
                    .order_by(t.c.ts.desc(), t.c.id.desc())
                    .limit(limit + 1)
                ).all()
        except StorageError as exc:
            if _sqlstate(exc) == INVALID_REGEX:  # RE2 accepted it, PostgreSQL's engine does not
                raise InvalidInput("query: a regex in it is not supported by the log store (PostgreSQL "
                                   "regular expressions); drop named groups and Perl-only syntax") from exc
            raise
        lines = [LogLine(id=r.id, ts=r.ts, level=r.level, host=r.host, message=r.message, trace_id=r.trace_id,
                         product=r.product)
                 for r in rows[:limit]]
        return LogPage(lines=lines, total_matches=total, has_more=len(rows) > limit)

    # ---- deploys ---------------------------------------------------------------------------

    def list_deploys(self, tenant_id: str, product: str, start: datetime, end: datetime,
                     limit: int = 200) -> list[Deploy]:
        t = telemetry_deploys
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t)
                .where(t.c.tenant_id == tenant_id, t.c.product == product, t.c.ts >= start, t.c.ts < end)
                .order_by(t.c.ts.desc(), t.c.id.desc())
                .limit(max(1, min(limit, 1000)))
            ).all()
        return [
            Deploy(ts=r.ts, version=r.version, actor=r.actor, host=r.host, duration_s=r.duration_s,
                   status=r.status, commit=r.commit, rolled_back=r.rolled_back)
            for r in rows
        ]

    # ---- traces ----------------------------------------------------------------------------

    def get_trace(self, tenant_id: str, request_id: str) -> Trace | None:
        t = telemetry_spans
        with self.db.connect() as conn:
            trace_id = conn.scalar(
                select(t.c.trace_id)
                .where(t.c.tenant_id == tenant_id, or_(t.c.trace_id == request_id, t.c.request_id == request_id))
                .order_by(t.c.start_ts)
                .limit(1)
            )
            if trace_id is None:
                return None
            # Span ids in code-point order, as Python compares them (get_traces pages by that
            # order): a database whose collation is not C (en_US, ICU) would sort 'B1' after 'a1'.
            span_id = t.c.span_id if self.db.is_sqlite else t.c.span_id.collate("C")
            of_trace = (t.c.tenant_id == tenant_id, t.c.trace_id == trace_id)
            rows = conn.execute(
                select(t).where(*of_trace)
                .order_by(t.c.start_ts, span_id)
                .limit(MAX_TRACE_SPANS + 1)
            ).all()
            cut = len(rows) > MAX_TRACE_SPANS
            # Past the cap, the trace's size and end still describe all of it (get_traces shows them).
            whole = conn.execute(select(func.count(), func.max(self._end_us(t.c.start_ts, t.c.duration_us)))
                                 .where(*of_trace)).one() if cut else None
        spans = [
            Span(trace_id=r.trace_id, span_id=r.span_id, parent_span_id=r.parent_span_id, service=r.service,
                 operation=r.operation, start=r.start_ts, duration_us=int(r.duration_us), status=r.status,
                 error_message=r.error_message, tags=dict(r.tags or {}), request_id=r.request_id)
            for r in rows[:MAX_TRACE_SPANS]
        ]
        if whole is None:
            return Trace(trace_id=trace_id, spans=spans)
        return Trace(trace_id=trace_id, spans=spans, truncated=True, span_total=int(whole[0]),
                     ends_at=EPOCH + timedelta(microseconds=int(whole[1])))

    def _end_us(self, start: Any, duration_us: Any) -> Any:
        """When a span ends, in microseconds since the epoch, exactly. SQLite stores the start as
        text, 'YYYY-MM-DD HH:MM:SS.ffffff': its fraction is read from the text (strftime keeps
        milliseconds only), as embedded_metrics does."""
        if self.db.is_sqlite:
            whole = cast(func.strftime("%s", start), Integer) * 1_000_000
            return whole + cast(func.substr(start, 21, 6), Integer) + duration_us
        return cast(func.extract("epoch", start) * 1_000_000, BigInteger) + duration_us

    # ---- incidents -------------------------------------------------------------------------

    @staticmethod
    def _incident(r: Any) -> Incident:
        return Incident(ref=r.ref, product=r.product, title=r.title, severity=r.severity, opened_at=r.opened_at,
                        closed_at=r.closed_at, findings=r.findings, resolution=r.resolution,
                        target_type=r.target_type, target_id=r.target_id)

    def search_incidents(self, tenant_id: str, query: IncidentQuery) -> IncidentPage:
        t = telemetry_incidents
        tokens = search_tokens(query.text)
        if not tokens:
            raise InvalidInput("query needs at least one word of two or more letters")
        title = func.lower(t.c.title)
        body = func.lower(t.c.findings + literal(" ") + t.c.resolution)
        # A word in the title counts twice: titles are what people write to be found.
        score: Any = literal(0)
        for token in tokens:
            pattern = f"%{like_escape(token)}%"
            score = score + case((title.like(pattern, escape="\\"), 2), else_=0) \
                + case((body.like(pattern, escape="\\"), 1), else_=0)
        score = score.label("score")
        where: list[Any] = [t.c.tenant_id == tenant_id, score > 0]
        if query.product:
            where.append(t.c.product == query.product)
        if query.start is not None:
            where.append(t.c.opened_at >= query.start)
        if query.end is not None:
            where.append(t.c.opened_at < query.end)
        if query.after is not None:
            s, opened, row_id = query.after
            where.append(tuple_(score, t.c.opened_at, t.c.id) < tuple_(literal(int(s)), literal(opened, t.c.opened_at.type),
                                                                      literal(int(row_id))))
        limit = max(1, min(query.limit, 25))
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t, score).where(*where)
                .order_by(score.desc(), t.c.opened_at.desc(), t.c.id.desc())
                .limit(limit + 1)
            ).all()
        hits = [IncidentHit(incident=self._incident(r), score=float(r.score),
                            position=(int(r.score), r.opened_at, int(r.id))) for r in rows[:limit]]
        return IncidentPage(hits=hits, has_more=len(rows) > limit)

    @staticmethod
    def _open_at(tenant_id: str, at: datetime | None, target_type: str | None,
                 target_ids: tuple[str, ...]) -> list[Any]:
        t = telemetry_incidents
        where: list[Any] = [t.c.tenant_id == tenant_id]
        if at is None:
            where.append(t.c.closed_at.is_(None))
        else:
            where += [t.c.opened_at <= at, or_(t.c.closed_at.is_(None), t.c.closed_at > at)]
        # An incident filed against a product only is about that product: filter on what the
        # tools show (target_type "product", target_id the product), not on the raw columns.
        shown_type = func.coalesce(t.c.target_type, case((t.c.product.is_not(None), literal("product")), else_=None))
        shown_id = func.coalesce(t.c.target_id, t.c.product)
        if target_type is not None:
            where.append(shown_type == target_type)
        if target_ids:
            where.append(and_(shown_id.is_not(None), shown_id.in_(target_ids)))
        return where

    def incidents_at(self, tenant_id: str, at: datetime | None, *, target_type: str | None = None,
                     target_ids: tuple[str, ...] = (), limit: int = 100) -> list[Incident]:
        t = telemetry_incidents
        where = self._open_at(tenant_id, at, target_type, target_ids)
        with self.db.connect() as conn:
            rows = conn.execute(select(t).where(*where).order_by(t.c.opened_at.desc(), t.c.id.desc())
                                .limit(max(1, min(limit, 500)))).all()
        return [self._incident(r) for r in rows]

    def count_incidents_at(self, tenant_id: str, at: datetime | None, *, target_type: str | None = None,
                           target_ids: tuple[str, ...] = ()) -> int:
        t = telemetry_incidents
        where = self._open_at(tenant_id, at, target_type, target_ids)
        with self.db.connect() as conn:
            return int(conn.scalar(select(func.count()).select_from(t).where(*where)) or 0)

    def select_incidents(self, tenant_id: str, *, refs: tuple[str, ...] = (), product: str | None = None,
                         severity: str | None = None, start: datetime | None = None, end: datetime | None = None,
                         limit: int = 1000) -> list[Incident]:
        t = telemetry_incidents
        where: list[Any] = [t.c.tenant_id == tenant_id]
        if refs:
            where.append(t.c.ref.in_(refs))
        if product is not None:
            where.append(t.c.product == product)
        if severity is not None:
            where.append(t.c.severity == severity)
        if start is not None:
            where.append(t.c.opened_at >= start)
        if end is not None:
            where.append(t.c.opened_at < end)
        with self.db.connect() as conn:
            rows = conn.execute(select(t).where(*where).order_by(t.c.opened_at, t.c.id)
                                .limit(max(1, limit))).all()
        return [self._incident(r) for r in rows]

    # ---- product info ----------------------------------------------------------------------

    def get_admin_info(self, tenant_id: str, product: str) -> dict[str, Any] | None:
        t = telemetry_products
        with self.db.connect() as conn:
            row = conn.execute(select(t.c.info, t.c.updated_at)
                               .where(t.c.tenant_id == tenant_id, t.c.product == product)).first()
        if row is None:
            return None
        return {**dict(row.info or {}), "reported_at": row.updated_at}

    def list_products(self, tenant_id: str, start: datetime, end: datetime, *, limit: int) -> list[ProductSeen]:
        """What the embedded store knows of: each table that names products, bounded to the
        window and to the newest mention per product (one grouped query per table)."""
        return self._products(tenant_id, start, end, limit=limit)

    def find_product(self, tenant_id: str, product: str, start: datetime, end: datetime) -> ProductSeen | None:
        """One product as ``list_products`` would list it, however many others are newer."""
        found = self._products(tenant_id, start, end, limit=1, product=product)
        return found[0] if found else None

    def _products(self, tenant_id: str, start: datetime, end: datetime, *, limit: int,
                  product: str | None = None) -> list[ProductSeen]:
        tables = (("metrics", telemetry_metrics, telemetry_metrics.c.product, telemetry_metrics.c.ts),
                  ("logs", telemetry_logs, telemetry_logs.c.product, telemetry_logs.c.ts),
                  ("deploys", telemetry_deploys, telemetry_deploys.c.product, telemetry_deploys.c.ts),
                  ("admin", telemetry_products, telemetry_products.c.product, telemetry_products.c.updated_at),
                  ("incidents", telemetry_incidents, telemetry_incidents.c.product, telemetry_incidents.c.opened_at))
        seen: dict[str, tuple[list[str], datetime]] = {}
        with self.db.connect() as conn:
            for kind, table, name_col, ts in tables:
                # Products whose last report is older than the window still exist: the admin
                # envelope and incidents are read whole, the streams by the window.
                window = [ts >= start] if kind in ("metrics", "logs", "deploys") else []
                named = [name_col == product] if product is not None else [name_col.is_not(None)]
                newest = func.max(ts)
                # The newest of each table: the newest overall are then among them, whatever
                # the limit cuts (without the order, a table's cut kept whichever came first).
                rows = conn.execute(select(name_col, newest).where(
                    table.c.tenant_id == tenant_id, *named, ts <= end, *window)
                    .group_by(name_col).order_by(newest.desc(), name_col).limit(limit * 4)).all()
                for name, last in rows:
                    kinds, latest = seen.get(name, ([], last))
                    kinds.append(kind)
                    seen[name] = (kinds, max(latest, last))
        ordered = sorted(seen.items(), key=lambda kv: (-kv[1][1].timestamp(), kv[0]))[:limit]
        return [ProductSeen(product=name, seen_in=tuple(kinds), last_seen=last) for name, (kinds, last) in ordered]

    def sources(self) -> TelemetrySources:
        return TelemetrySources(logs=self, metrics=self.metrics, deploys=self, traces=self, incidents=self, admin=self,
                                llmops=self.llmops, products=self)
