"""Post-mortem jobs: a batch of incidents, each investigated by a turn of the ``postmortem``
profile (kortex/postmortems/profile.py) on the batch lane, its document stored by the turn's
end hook.

How a job moves, all by compare-and-set on rows (kortex/storage/postmortems.py):
- ``submit`` stores the job and one item per incident, and dispatches the first
  ``concurrency`` items (queued -> dispatched); each is one ``kortex.postmortem.item`` task.
- ``start_item`` (that task) creates the item's session and turn (dispatched -> running) and
  hands step 0 to the batch lane. A duplicate delivery finds the item moved on.
- The turn's end hook (``on_end``), in the transaction that ends the turn, stores the document
  (one per item: a unique key) or the failure, then ``advance`` dispatches the next item.
- The watchdog re-sends items whose task never started them and advances jobs with free slots
  (``sweep``), so a job survives every worker being restarted.
The database is the source of truth; Flower shows the tasks, and the events feed is a view.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy.engine import Connection

from kortex import budget, timeparse
from kortex.container import Kortex
from kortex.errors import BudgetExceeded, Conflict, InvalidInput, KortexError, NotFound, RateLimited
from kortex.ids import uuid7
from kortex.messages import AssistantMessage, Message, ToolMessage
from kortex.postmortems.document import PostMortem
from kortex.storage import chats, invocations, posting, turns
from kortex.storage import postmortems as store
from kortex.storage.records import ItemRecord, JobRecord, PostmortemRecord, TurnRecord
from kortex.telemetry.sources import Incident
from kortex.text import Storable, check_storable
from kortex.timeparse import isoformat, utcnow
from kortex.turns import chat
from kortex.turns.handoff import NOTHING, Handoff, ItemDispatch, StepDispatch
from kortex.turns.profiles import TurnEnd
from kortex.turns.spendguard import SpendCap

log = logging.getLogger(__name__)

PROFILE = "postmortem"
SUBMIT = "submit_postmortem"
MAX_ITEMS = 1000
MAX_CONCURRENCY = 32
#: documents in one page of a job's: each may be a few hundred KiB
DOCUMENTS_PAGE = 20
MAX_DOCUMENTS_PAGE = 50
#: invalid documents the model may be told about before the item fails (the third one fails it)
MAX_INVALID = 2
TEMPLATES: dict[str, str] = {
    "default": "",
    "brief": "Keep the summary to three sentences, the timeline to the five entries that matter most, and at "
             "most three action items.",
}
#: also a path parameter's pattern (pydantic's regex engine, where ``$`` is the very end):
#: Python code must ``fullmatch`` it, as its ``$`` also matches before a final newline
INCIDENT_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$")
_SPAN = re.compile(r"^\d+\s*[a-z]+\Z")


class JobFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    product: Storable | None = Field(None, min_length=1, max_length=200)
    severity: Literal["info", "warn", "error", "critical"] | None = None
    since: Storable = Field(description="Incidents that opened at or after this: ISO 8601, or '30d' for 30 days ago")
    until: Storable | None = Field(None, description="... and before this (default: now)")


class JobRequest(BaseModel):
    """What a user asks for: incident ids, or a filter; with the job's limits."""

    model_config = ConfigDict(extra="forbid")

    incident_ids: list[str] | None = Field(None, min_length=1, max_length=MAX_ITEMS)
    filter: JobFilter | None = None
    model: Storable | None = Field(None, min_length=1, max_length=200)
    max_usd: float | None = Field(None, gt=0, le=100_000)
    concurrency: int = Field(4, ge=1, le=MAX_CONCURRENCY)
    template: str = Field("default", max_length=64)
    force: bool = Field(False, description="write a new post-mortem even for incidents that have one")

    @field_validator("incident_ids")
    @classmethod
    def _refs(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        bad = [v for v in value if not INCIDENT_REF.fullmatch(v)]
        if bad:
            raise ValueError(f"not incident ids: {', '.join(repr(b[:70]) for b in bad[:5])}")
        return list(dict.fromkeys(value))  # the same incident twice is one item

    @field_validator("template")
    @classmethod
    def _template(cls, value: str) -> str:
        if value not in TEMPLATES:
            raise ValueError(f"unknown template {value!r}; known: {', '.join(TEMPLATES)}")
        return value

    @model_validator(mode="after")
    def _one_selection(self) -> JobRequest:
        if (self.incident_ids is None) == (self.filter is None):
            raise ValueError("give exactly one of incident_ids or filter")
        return self


@dataclass(frozen=True, slots=True)
class JobView:
    job: JobRecord
    counts: dict[str, int]
    spend_usd: float


@dataclass(frozen=True, slots=True)
class Submitted:
    view: JobView
    created: bool
    handoff: Handoff


def _when(value: str, now: datetime, field: str) -> datetime:
    text = value.strip()
    if _SPAN.match(text):  # "30d": that long ago
        text = f"{text} ago"
    try:
        return timeparse.parse_instant(text, now=now)
    except InvalidInput as exc:
        raise InvalidInput(f"{field}: {exc.message}", code="validation",
                           details=[{"field": field, "message": exc.message}]) from None


def _select(k: Kortex, tenant_id: str, request: JobRequest, now: datetime) -> list[Incident]:
    source = k.sources.incidents
    if request.incident_ids is not None:
        found = source.select_incidents(tenant_id, refs=tuple(request.incident_ids), limit=MAX_ITEMS)
        missing = sorted(set(request.incident_ids) - {i.ref for i in found})
        if missing:
            raise NotFound(f"no such incidents: {', '.join(missing[:10])}", details={"missing": missing[:50]})
        order = {ref: n for n, ref in enumerate(request.incident_ids)}
        return sorted(found, key=lambda i: order[i.ref])
    assert request.filter is not None
    f = request.filter
    start = _when(f.since, now, "filter.since")
    end = _when(f.until, now, "filter.until") if f.until else now
    if end <= start:
        raise InvalidInput("filter.until must be after filter.since", code="validation",
                           details=[{"field": "filter.until", "message": "not after since"}])
    found = source.select_incidents(tenant_id, product=f.product, severity=f.severity, start=start, end=end,
                                    limit=MAX_ITEMS + 1)
    if len(found) > MAX_ITEMS:
        raise InvalidInput(f"the filter matches more than {MAX_ITEMS} incidents; narrow it", code="validation",
                           details=[{"field": "filter", "message": "too many incidents"}])
    return found


def _snapshot(incident: Incident) -> dict[str, Any]:
    return {"id": incident.ref, "title": incident.title, "product": incident.product,
            "severity": incident.severity, "opened_at": isoformat(incident.opened_at),
            "closed_at": isoformat(incident.closed_at) if incident.closed_at else None}


def _request_hash(request: JobRequest) -> str:
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


def submit(k: Kortex, tenant_id: str, request: JobRequest, *, idempotency_key: str | None = None,
           by: str | None = None) -> Submitted:
    """Store a job and its items and dispatch the first ones. With ``idempotency_key``, the same
    request again answers the job it made; a different request with that key is a Conflict."""
    check_storable(idempotency_key, "Idempotency-Key")
    if request.model is not None:
        chat.resolve_model(k, request.model)  # unknown or unavailable: a 4xx now, not a failed item later
    digest = _request_hash(request)
    earlier = _replayed(k, tenant_id, idempotency_key, digest)
    if earlier is not None:
        return earlier
    now = utcnow()
    incidents = _select(k, tenant_id, request, now)
    for _ in range(2):
        try:
            with _counting_job(k, tenant_id):
                return _store_job(k, tenant_id, request, uuid7(), incidents, digest, idempotency_key, by, now)
        except Conflict as exc:
            if exc.code != "integrity" or idempotency_key is None:
                raise
        # Two identical requests raced on the Idempotency-Key: the loser answers the winner's job.
        earlier = _replayed(k, tenant_id, idempotency_key, digest)
        if earlier is not None:
            return earlier
    raise Conflict("the job could not be stored; try again", code="conflict")


@contextmanager
def _counting_job(k: Kortex, tenant_id: str) -> Iterator[None]:
    """Count a new job against the tenant's ``batch.jobs_per_minute`` (RateLimited past it), and
    give the count back if the job is not stored: a job refused (the open-items cap, a lost
    race on its Idempotency-Key) costs no quota, and neither does a replay, which never gets here."""
    with budget.Quota(k.redis, k.settings.redis_prefix, "postmortem_jobs", k.settings.batch.jobs_per_minute,
                      "post-mortem jobs").counting(tenant_id):
        yield


def _check_open_items(conn: Connection, tenant_id: str, request: JobRequest, queued: int, cap: int) -> None:
    """Refuse a job whose items would take the tenant past ``cap`` unfinished items across its
    jobs: whole, so a job never runs a part of what was asked. Under the tenant's lock, so two
    jobs racing for the last room cannot both pass. A job larger than the cap itself could
    never pass: that is bad input (narrow it), not a reason to retry."""
    if queued > cap:
        field = "incident_ids" if request.incident_ids is not None else "filter"
        raise InvalidInput(f"the job would queue {queued} post-mortems; a tenant may have at most {cap} unfinished: "
                           "narrow it", code="validation", details=[{"field": field, "message": f"more than {cap}"}])
    if not queued:
        return
    open_now = store.tenant_open_count(conn, tenant_id)
    if open_now + queued > cap:
        raise RateLimited(
            f"this tenant has {open_now} post-mortem items unfinished and may have at most {cap}; a job of "
            f"{queued} more would pass that: retry once some have finished, or cancel a job",
            code="too_many_open_items",
            details={"limit": "max_open_items_per_tenant", "open": open_now, "requested": queued, "cap": cap})


def _replayed(k: Kortex, tenant_id: str, key: str | None, digest: str) -> Submitted | None:
    """The job this Idempotency-Key made, if any; the key used for another request is a Conflict."""
    if key is None:
        return None
    with k.db.connect() as conn:
        made = posting.replayed(store.job_by_key(conn, tenant_id, key), digest)
    return None if made is None else Submitted(view=view(k, tenant_id, made.id), created=False, handoff=NOTHING)


def _store_job(k: Kortex, tenant_id: str, request: JobRequest, job_id: str, incidents: list[Incident], digest: str,
               idempotency_key: str | None, by: str | None, now: datetime) -> Submitted:
    with k.db.begin() as conn:
        store.lock_tenant(conn, tenant_id)  # a concurrent job of the tenant sees this one's items
        refs = [i.ref for i in incidents]
        done_before = {} if request.force else store.existing_refs(conn, tenant_id, refs)
        busy = store.open_refs(conn, tenant_id, refs)
        items = []
        for position, incident in enumerate(incidents):
            error = None
            if incident.ref in busy:  # another job of the tenant is on it: never two bills for one incident
                error = {"code": "in_progress", "message": "another job of this tenant is writing its post-mortem"}
            elif incident.ref in done_before:  # already written: not redone unless the job forces it
                error = {"code": "exists", "message": "the incident already has a post-mortem (force=true redoes it)",
                         "postmortem_id": done_before[incident.ref]}
            items.append({
                "id": uuid7(), "tenant_id": tenant_id, "job_id": job_id, "position": position,
                "incident_ref": incident.ref, "incident": _snapshot(incident),
                "status": "skipped" if error else "queued", "error": error,
                "turn_id": None, "cost_usd": 0.0, "dispatched_at": None, "started_at": None,
                "finished_at": now if error else None,
            })
        _check_open_items(conn, tenant_id, request, sum(1 for i in items if i["status"] == "queued"),
                          k.settings.batch.max_open_items_per_tenant)
        job = {"id": job_id, "tenant_id": tenant_id, "status": "queued",
               "selection": request.model_dump(mode="json", exclude={"model", "max_usd", "concurrency", "template",
                                                                     "force"}),
               "model": request.model, "max_usd": request.max_usd, "concurrency": request.concurrency,
               "template": request.template, "force": request.force, "idempotency_key": idempotency_key,
               "request_hash": digest, "session_id": None, "created_by": by, "created_at": now,
               "started_at": None, "finished_at": None}
        store.insert_job(conn, job, items)
        handoff = advance(conn, tenant_id, job_id, now, k.settings.batch.max_active_items_per_tenant)
    return Submitted(view=view(k, tenant_id, job_id), created=True, handoff=handoff)


def advance(conn: Connection, tenant_id: str, job_id: str, now: datetime, tenant_cap: int) -> Handoff:
    """Dispatch as many queued items as the job's concurrency, and the tenant's share of the
    batch lane (``tenant_cap`` items in flight across its jobs), have room for; skip the rest
    when its budget is spent; mark it done when nothing is left open."""
    job = store.get_job(conn, tenant_id, job_id, lock=True)  # one advance of a job at a time
    if job.status not in ("queued", "running"):
        return NOTHING
    # One advance of the tenant's jobs at a time too, or two of them each count the tenant's
    # items in flight before either dispatches and together pass its cap. Always the job's
    # row, then the tenant's: every caller (submit, start_item, on_end, sweep) holds at most
    # the one job's row when it comes here, and takes no other lock after.
    store.lock_tenant(conn, tenant_id)
    if job.max_usd is not None and store.spend(conn, tenant_id, job_id) >= job.max_usd:
        store.end_open_items(conn, tenant_id, job_id, "skipped", now,
                             {"code": "budget", "message": f"the job's max_usd ({job.max_usd:g}) was spent"},
                             from_status=("queued",))
    room = min(job.concurrency - store.active_count(conn, job_id),
               tenant_cap - store.tenant_active_count(conn, tenant_id))
    items = store.dispatch_next(conn, job_id, room, now)
    if items and job.status == "queued":
        store.set_job_status(conn, tenant_id, job_id, "running", now, from_status=("queued",))
    store.finish_if_complete(conn, tenant_id, job_id, now)
    return Handoff(items=tuple(ItemDispatch(tenant_id=tenant_id, item_id=i.id) for i in items))


def _request_text(item: ItemRecord, template: str | None) -> str:
    incident = item.incident
    opened = timeparse.parse_instant(incident["opened_at"])
    closed = timeparse.parse_instant(incident["closed_at"]) if incident.get("closed_at") else opened + timedelta(hours=2)
    window = f"{isoformat(opened - timedelta(hours=1))}/{isoformat(closed + timedelta(minutes=30))}"
    lines = [f"Write the post-mortem of incident {incident['id']}.",
             "incident: " + json.dumps(incident, sort_keys=True),
             f"investigation window: {window}"]
    extra = TEMPLATES.get(template or "default", "")
    if extra:
        lines.append(extra)
    return "\n".join(lines)


def start_item(k: Kortex, tenant_id: str, item_id: str) -> Handoff:
    """The item's task: create its turn and hand step 0 to the batch lane. Safe to run twice."""
    now = utcnow()
    cap = k.settings.batch.max_active_items_per_tenant
    with k.db.begin() as conn:
        item = store.get_item(conn, tenant_id, item_id)
        if item is None or item.status != "dispatched":
            return NOTHING  # a duplicate delivery, or a cancel got there first
        # The job's row first, then the item's: the order cancel and advance lock them in.
        job = store.get_job(conn, tenant_id, item.job_id, lock=True)
        # Read again under the job's lock: a second delivery that read the item before the
        # first one committed finds it started here, and does nothing.
        item = store.get_item(conn, tenant_id, item_id)
        if item is None or item.status != "dispatched":
            return NOTHING
        if job.status not in ("queued", "running"):
            store.end_item(conn, tenant_id, item_id, "cancelled", now, error={"code": "cancelled"},
                           from_status=("dispatched",))
            return NOTHING
        if job.max_usd is not None and store.spend(conn, tenant_id, job.id) >= job.max_usd:
            store.end_item(conn, tenant_id, item_id, "skipped", now, from_status=("dispatched",),
                           error={"code": "budget", "message": f"the job's max_usd ({job.max_usd:g}) was spent"})
            return advance(conn, tenant_id, job.id, now, cap)
        session = chats.create_session(conn, tenant_id, f"post-mortem {item.incident_ref}", job.model)
        # Its own session: a session runs one turn at a time, and items of a job run side by side.
        # Not counted against the tenant's chat concurrency: the job's own concurrency bounds it.
        new = posting.create_turn(conn, tenant_id=tenant_id, session_id=session.id,
                                content=_request_text(item, job.template), model=job.model,
                                deadline=timedelta(seconds=k.settings.turn.deadline), profile=PROFILE)
        if not store.start_item(conn, tenant_id, item_id, new.turn.id, now):
            raise Conflict("the item moved on while it started", code="conflict")  # rolls the turn back
    return Handoff(steps=(StepDispatch(tenant_id=tenant_id, turn_id=new.turn.id, step=0, lane="batch"),))


# ---- the turn's side: what the profile runs ------------------------------------------------


def _submissions(history: list[Message]) -> tuple[dict[str, Any] | None, list[Any]]:
    """The last accepted document of the turn, and the errors of the rejected ones, in order."""
    results = {m.result.call_id: m.result for m in history if isinstance(m, ToolMessage)}
    accepted: dict[str, Any] | None = None
    rejected: list[Any] = []
    for message in history:
        if not isinstance(message, AssistantMessage):
            continue
        for call in message.tool_calls:
            if call.name != SUBMIT or call.id not in results:
                continue
            result = results[call.id]
            if result.is_error:
                rejected.append(result.content)
            else:
                accepted = call.arguments
    return accepted, rejected


def before_call(conn: Connection, turn: TurnRecord, history: list[Message]) -> KortexError | None:
    """Before each LLM call of an item's turn: the job's budget, and the model's attempts at a
    valid document (told of the errors at most ``MAX_INVALID`` times)."""
    item = store.item_of_turn(conn, turn.tenant_id, turn.id)
    if item is None:
        return None
    accepted, rejected = _submissions(history)
    if accepted is None and len(rejected) > MAX_INVALID:
        return InvalidInput(f"the post-mortem failed validation {len(rejected)} times", code="invalid_postmortem",
                            details=rejected[-1])
    # A cancelled job's running items finish (cancel with running=cancel cancels their turns).
    job = store.get_job(conn, turn.tenant_id, item.job_id)
    if job.max_usd is not None:
        spent = store.spend(conn, turn.tenant_id, job.id)
        if spent >= job.max_usd:
            return BudgetExceeded(f"the job's max_usd ({job.max_usd:g}) is spent ({spent:.4f})", code="budget")
    return None


def spend_cap(conn: Connection, turn: TurnRecord) -> SpendCap | None:
    """An item's job's ``max_usd``, for the step to reserve its call's cost against: the items
    running together each passed the check above on the job's spend so far, and would have
    passed the cap by as many calls."""
    item = store.item_of_turn(conn, turn.tenant_id, turn.id)
    if item is None:
        return None
    job = store.get_job(conn, turn.tenant_id, item.job_id)
    if job.max_usd is None:
        return None
    return SpendCap(scope=f"max_usd:{job.id}", limit=job.max_usd, spent=store.spend(conn, turn.tenant_id, job.id),
                    what="the job's max_usd")


def on_end(k: Kortex, conn: Connection, turn: TurnRecord, end: TurnEnd) -> Handoff:
    """In the transaction that ended an item's turn: store its document (or why there is none),
    settle the item and let the job go on. Runs once per turn (the turn's compare-and-set won)."""
    item = store.item_of_turn(conn, turn.tenant_id, turn.id)
    if item is None or item.status != "running":
        return NOTHING
    now = utcnow()
    cost = float(conn.execute(turns.cost_of(turn.tenant_id, turn.id)).scalar() or 0.0)
    status, error = _outcome(k, conn, turn, item, end, now)
    store.end_item(conn, turn.tenant_id, item.id, status, now, error=error, cost_usd=cost)
    return advance(conn, turn.tenant_id, item.job_id, now, k.settings.batch.max_active_items_per_tenant)


def _outcome(k: Kortex, conn: Connection, turn: TurnRecord, item: ItemRecord, end: TurnEnd,
             now: datetime) -> tuple[str, dict[str, Any] | None]:
    if end.status == "cancelled":
        return "cancelled", {"code": "cancelled", "message": "cancelled while it ran"}
    history = chats.load_history(conn, turn.tenant_id, turn.session_id, limit=10_000)
    accepted, rejected = _submissions(history)
    if accepted is None:
        if end.status == "failed" and end.error == "budget":
            return "skipped", {"code": "budget", "message": "the job's max_usd was spent while it ran"}
        if rejected:
            return "failed", {"code": "invalid_postmortem", "message": "no valid post-mortem was submitted",
                              "errors": rejected[-1]}
        code = end.error or "no_postmortem"
        return "failed", {"code": code, "message": "the investigation ended without a post-mortem"
                          if end.status == "done" else f"the investigation failed ({code})"}
    try:
        document = PostMortem.model_validate(accepted)
    except ValidationError as exc:  # the tool validated it; a change of model since is a bug to see
        return "failed", {"code": "invalid_postmortem", "message": str(exc)[:2000]}
    cited = document.cited()
    known = invocations.succeeded_calls(conn, turn.tenant_id, turn.id)
    grounding: dict[str, Any] = {"cited": len(cited), "dangling": [c for c in cited if c not in known]}
    if document.incident_id != item.incident_ref:
        # The job knows which incident this is; a model that wrote another id is corrected, and
        # the correction is kept with the document.
        grounding["incident_id_given"] = document.incident_id
        document = document.model_copy(update={"incident_id": item.incident_ref})
    store.insert_postmortem(conn, {
        "id": uuid7(), "tenant_id": turn.tenant_id, "item_id": item.id, "job_id": item.job_id, "turn_id": turn.id,
        "incident_ref": item.incident_ref, "document": document.model_dump(mode="json"), "grounding": grounding,
        "created_at": now})
    return "done", None


# ---- reading and stopping -----------------------------------------------------------------


def view(k: Kortex, tenant_id: str, job_id: str) -> JobView:
    with k.db.connect() as conn:
        job = store.get_job(conn, tenant_id, job_id)
        return JobView(job=job, counts=store.counts(conn, tenant_id, job_id),
                       spend_usd=store.spend(conn, tenant_id, job_id))


def list_items(k: Kortex, tenant_id: str, job_id: str, *, after: int = -1, limit: int = 100,
               status: str | None = None) -> list[ItemRecord]:
    if status is not None and status not in store.ITEM_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(store.ITEM_STATUSES)}", code="validation",
                           details=[{"field": "status", "message": "unknown status"}])
    with k.db.connect() as conn:
        store.get_job(conn, tenant_id, job_id)  # another tenant's job is not found
        return store.list_items(conn, tenant_id, job_id, after=after, limit=limit, status=status)


@dataclass(frozen=True, slots=True)
class Progress:
    """A page of a job's progress feed: events after a point, the items they name, and whether
    the job is over (finished, nothing left running)."""

    events: list[Any]
    items: dict[str, ItemRecord]
    view: JobView
    over: bool


def progress(k: Kortex, tenant_id: str, job_id: str, after: int) -> Progress:
    with k.db.connect() as conn:
        # Read the job's state before the events: if it is over here, every event is below.
        job = store.get_job(conn, tenant_id, job_id)
        over = job.finished_at is not None and not store.any_open(conn, tenant_id, job_id)
        events = store.events_after(conn, tenant_id, job_id, after)
        items = store.items_by_id(conn, tenant_id, job_id, {e.item_id for e in events if e.item_id})
        job_view = JobView(job=job, counts=store.counts(conn, tenant_id, job_id),
                           spend_usd=store.spend(conn, tenant_id, job_id))
    return Progress(events=events, items=items, view=job_view, over=over and len(events) < 500)


def postmortem_of(k: Kortex, tenant_id: str, incident_ref: str) -> PostmortemRecord:
    with k.db.connect() as conn:
        return store.latest_postmortem(conn, tenant_id, incident_ref)


def postmortems_of(k: Kortex, tenant_id: str, job_id: str, *, after: str | None = None,
                   limit: int = DOCUMENTS_PAGE) -> list[PostmortemRecord]:
    """A page of the documents the job wrote, in incident order after the incident ``after``."""
    if not 1 <= limit <= MAX_DOCUMENTS_PAGE:
        raise InvalidInput(f"limit must be 1-{MAX_DOCUMENTS_PAGE}", code="validation",
                           details=[{"field": "limit", "message": f"not 1-{MAX_DOCUMENTS_PAGE}"}])
    with k.db.connect() as conn:
        store.get_job(conn, tenant_id, job_id)
        return store.postmortems_of_job(conn, tenant_id, job_id, after=after, limit=limit)


@dataclass(frozen=True, slots=True)
class CancelReport:
    view: JobView
    cancelled_queued: int  # items that had not started
    running: int           # items running when the cancel came
    running_action: Literal["finish", "cancel"]


def cancel(k: Kortex, tenant_id: str, job_id: str, *, running: Literal["finish", "cancel"] = "finish",
           by: str) -> tuple[CancelReport, Handoff]:
    """Stop a job: items not started are cancelled; running ones finish (``finish``) or are
    cancelled at their next step boundary (``cancel``). Idempotent; a finished job is a Conflict."""
    from kortex.turns.cancel import cancel_turn  # the turn engine's cancel, for running items

    now = utcnow()
    with k.db.begin() as conn:
        job = store.get_job(conn, tenant_id, job_id, lock=True)
        if job.status in ("done", "failed"):
            raise Conflict("the job already finished", code="job_finished", details={"status": job.status})
        stopped = store.end_open_items(conn, tenant_id, job_id, "cancelled", now,
                                       {"code": "cancelled", "message": f"the job was cancelled by {by}"})
        store.set_job_status(conn, tenant_id, job_id, "cancelled", now, from_status=("queued", "running"))
        live = store.running_turns(conn, tenant_id, job_id)
    handoff = NOTHING
    if running == "cancel":
        for turn_id in live:
            try:
                handoff += cancel_turn(k, tenant_id, turn_id, by=by)[1]
            except Conflict:  # it ended on its own meanwhile
                pass
    return CancelReport(view=view(k, tenant_id, job_id), cancelled_queued=stopped, running=len(live),
                        running_action=running), handoff


# ---- the watchdog's part ------------------------------------------------------------------


def sweep(k: Kortex, now: datetime, batch_idle: bool) -> Handoff:
    """Re-send items whose task was lost (only while the batch queue is empty: one waiting there
    is merely waiting), and advance jobs with room, such as one whose hand-off was lost."""
    handoff = NOTHING
    with k.db.connect() as conn:
        # As for turns: a dispatched item its task has not started within ``turn.requeue_after``
        # while the batch queue is empty; with a backlog, one waiting ten times that long (a
        # duplicate is harmless: starting an item is a compare-and-set).
        after = k.settings.turn.requeue_after * (1 if batch_idle else 10)
        stale = store.stale_dispatched(conn, now - timedelta(seconds=after))
        jobs = store.jobs_with_room(conn)
    handoff += Handoff(items=tuple(ItemDispatch(tenant_id=i.tenant_id, item_id=i.id) for i in stale))
    for tenant_id, job_id in jobs:
        try:
            with k.db.begin() as conn:
                handoff += advance(conn, tenant_id, job_id, now, k.settings.batch.max_active_items_per_tenant)
        except KortexError:
            log.exception("could not advance post-mortem job %s", job_id)
    return handoff


__all__ = ["CancelReport", "ItemRecord", "PostmortemRecord", "JobFilter", "JobRequest", "JobView", "Submitted", "advance", "before_call", "cancel", "progress",
           "list_items", "on_end", "postmortem_of", "postmortems_of", "start_item", "submit", "sweep", "view"]
