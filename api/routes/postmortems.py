"""Batch post-mortem jobs and the documents they write (kortex/postmortems/jobs.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.deps import CallerDep, KortexDep, TenantDep, allowed, object_id
from api.openapi import ERRORS
from api.revocation import StreamGate, open_stream
from api.sse import HeldStream
from kortex.access import Permission
from kortex.errors import InvalidInput
from kortex.postmortems import jobs
from kortex.postmortems.document import PostMortem
from kortex.postmortems.jobs import ItemRecord, PostmortemRecord

router = APIRouter(tags=["postmortems"], dependencies=[Depends(allowed(Permission.CHAT))], responses=ERRORS)
log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
POLL_S = 1.0  # the progress feed reads the job's rows this often: the database is the truth
MAX_FEED_S = 3600.0  # one connection's longest life; the client resumes with Last-Event-ID


class JobAccepted(BaseModel):
    job_id: str
    items: int
    status: str
    status_url: str
    events_url: str


class JobOut(BaseModel):
    id: str
    status: str
    counts: dict[str, int]
    items: int
    spend_usd: float
    max_usd: float | None
    concurrency: int
    model: str | None
    template: str | None
    selection: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, view: jobs.JobView) -> JobOut:
        j = view.job
        return cls(id=j.id, status=j.status, counts=view.counts, items=sum(view.counts.values()),
                   spend_usd=round(view.spend_usd, 6), max_usd=j.max_usd, concurrency=j.concurrency, model=j.model,
                   template=j.template, selection=j.selection, created_at=j.created_at, started_at=j.started_at,
                   finished_at=j.finished_at)


class ItemOut(BaseModel):
    id: str
    position: int
    incident_id: str
    status: str
    error: dict[str, Any] | None
    cost_usd: float
    turn_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    postmortem_url: str | None

    @classmethod
    def of(cls, item: ItemRecord) -> ItemOut:
        return cls(id=item.id, position=item.position, incident_id=item.incident_ref, status=item.status,
                   error=item.error, cost_usd=round(item.cost_usd, 6), turn_id=item.turn_id,
                   started_at=item.started_at, finished_at=item.finished_at,
                   postmortem_url=f"/v1/incidents/{item.incident_ref}/postmortem" if item.status == "done" else None)


class ItemPage(BaseModel):
    items: list[ItemOut]
    next_after: int | None


class CancelOut(BaseModel):
    job: JobOut
    cancelled_queued: int
    running: int
    running_action: Literal["finish", "cancel"]


class PostmortemOut(BaseModel):
    id: str
    incident_id: str
    job_id: str | None
    turn_id: str | None
    created_at: datetime
    grounding: dict[str, Any] | None
    document: PostMortem

    @classmethod
    def of(cls, found: PostmortemRecord) -> PostmortemOut:
        return cls(id=found.id, incident_id=found.incident_ref, job_id=found.job_id, turn_id=found.turn_id,
                   created_at=found.created_at, grounding=found.grounding,
                   document=PostMortem.model_validate(found.document))


class DocumentPage(BaseModel):
    documents: list[PostmortemOut]
    next_after: str | None


@router.post("/v1/postmortems", status_code=202, response_model=JobAccepted,
             responses={404: {"description": "an incident id that does not exist for this tenant"},
                        409: {"description": "the Idempotency-Key was used for another request"}})
def create_job(
    body: jobs.JobRequest,
    request: Request,
    k: KortexDep,
    caller: CallerDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> JobAccepted:
    """Write post-mortems for incidents (their ids, or a filter), `concurrency` at a time on the
    batch queue, stopping cleanly at `max_usd`. Incidents that already have a post-mortem are
    skipped unless `force`."""
    submitted = jobs.submit(k, caller.tenant.id, body, idempotency_key=idempotency_key, by=f"key:{caller.key_id}")
    if submitted.handoff:
        try:
            request.app.state.dispatch(submitted.handoff)
        except Exception:  # the broker is down: the job is stored, and the watchdog dispatches it
            log.warning("could not enqueue post-mortem job %s now; the watchdog will", submitted.view.job.id,
                        exc_info=True)
    job = submitted.view.job
    return JobAccepted(job_id=job.id, items=sum(submitted.view.counts.values()), status=job.status,
                       status_url=f"/v1/postmortems/{job.id}", events_url=f"/v1/postmortems/{job.id}/events")


@router.get("/v1/postmortems/{job_id}", response_model=JobOut)
def read_job(job_id: str, k: KortexDep, tenant: TenantDep) -> JobOut:
    """A job's status, its items counted by status, and what it has spent."""
    return JobOut.of(jobs.view(k, tenant.id, object_id(job_id, "post-mortem job")))


@router.get("/v1/postmortems/{job_id}/items", response_model=ItemPage)
def read_items(
    job_id: str,
    k: KortexDep,
    tenant: TenantDep,
    after: Annotated[int, Query(ge=-1, le=1_000_000, description="next_after of the page read last")] = -1,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    status: Annotated[str | None, Query(max_length=16)] = None,
) -> ItemPage:
    """A job's items in order, with each one's status, error, cost and post-mortem link."""
    items = jobs.list_items(k, tenant.id, object_id(job_id, "post-mortem job"), after=after, limit=limit,
                            status=status)
    return ItemPage(items=[ItemOut.of(i) for i in items], next_after=items[-1].position if len(items) == limit else None)


@router.post("/v1/postmortems/{job_id}/cancel", response_model=CancelOut,
             responses={409: {"description": "the job already finished"}})
def cancel_job(
    job_id: str,
    request: Request,
    k: KortexDep,
    caller: CallerDep,
    running: Annotated[Literal["finish", "cancel"], Query(
        description="what happens to items already running: finish them, or cancel them at their next step")] = "finish",
) -> CancelOut:
    """Stop a job: items not started are cancelled at once; running ones finish or are cancelled."""
    report, handoff = jobs.cancel(k, caller.tenant.id, object_id(job_id, "post-mortem job"), running=running,
                                  by=f"key:{caller.key_id}")
    if handoff:
        request.app.state.dispatch(handoff)
    return CancelOut(job=JobOut.of(report.view), cancelled_queued=report.cancelled_queued, running=report.running,
                     running_action=report.running_action)


def _after(last_event_id: str | None) -> int:
    if last_event_id is None:
        return 0
    if not last_event_id.isdigit() or len(last_event_id) > 9:
        raise InvalidInput("Last-Event-ID must be the id of an event of this feed", code="validation",
                           details=[{"field": "Last-Event-ID", "message": "not an event id"}])
    return int(last_event_id)


def _sse(event: str, event_id: int, data: dict[str, Any]) -> str:
    return f"id: {event_id}\nevent: {event}\ndata: {json.dumps(data, default=str)}\n\n"


@router.get("/v1/postmortems/{job_id}/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
async def job_events(
    job_id: str,
    request: Request,
    k: KortexDep,
    tenant: TenantDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64)] = None,
) -> StreamingResponse:
    """Progress as Server-Sent Events, numbered: `item_started`, `item_done` / `item_failed` /
    `item_skipped` / `item_cancelled` (the item), and `job_done` / `job_failed` /
    `job_cancelled` (the job). The stream ends once the job is over and nothing of it still
    runs; reconnect with `Last-Event-ID` for exactly the rest."""
    job_id = object_id(job_id, "post-mortem job")
    after = _after(last_event_id)
    await run_in_threadpool(jobs.view, k, tenant.id, job_id)  # 404 before the stream starts

    async def feed(gate: StreamGate) -> AsyncIterator[str]:
        cursor = after
        until = time.monotonic() + MAX_FEED_S
        while time.monotonic() < until and not gate.ended:
            page = await run_in_threadpool(jobs.progress, k, tenant.id, job_id, cursor)
            if gate.ended:  # revoked during the read
                break
            for event in page.events:
                item = page.items.get(event.item_id) if event.item_id else None
                data = ItemOut.of(item).model_dump(mode="json") if item is not None else \
                    JobOut.of(page.view).model_dump(mode="json")
                yield _sse(event.kind, event.seq, data)
                cursor = event.seq
            if page.over:
                return
            if await request.is_disconnected():
                return
            if not page.events:
                yield ": keepalive\n\n"
                await asyncio.sleep(POLL_S)
        # A feed held open longer than MAX_FEED_S ends; the client resumes with Last-Event-ID.
        # One whose key was revoked ends too, and its reconnection is refused.

    # A feed holds one of the tenant's stream slots, as a turn's stream does: it polls the
    # database every second for up to an hour, so the per-tenant cap bounds that load too.
    gate = open_stream(request)  # closed by HeldStream however the response ends
    try:
        return HeldStream(feed(gate), slots=request.app.state.stream_slots, tenant_id=tenant.id, gate=gate,
                          headers=SSE_HEADERS)
    except BaseException:  # refused (429): no stream to end
        gate.close()
        raise


@router.get("/v1/postmortems/{job_id}/documents", response_model=DocumentPage)
def job_documents(
    job_id: str,
    k: KortexDep,
    tenant: TenantDep,
    after: Annotated[str | None, Query(max_length=64, pattern=jobs.INCIDENT_REF.pattern,
                                       description="next_after of the page read last")] = None,
    limit: Annotated[int, Query(ge=1, le=jobs.MAX_DOCUMENTS_PAGE)] = jobs.DOCUMENTS_PAGE,
) -> DocumentPage:
    """The post-mortems this job wrote (not the incidents' latest: a later job may have redone
    one), a page at a time in incident order; `next_after` reads the next page."""
    found = jobs.postmortems_of(k, tenant.id, object_id(job_id, "post-mortem job"), after=after, limit=limit)
    return DocumentPage(documents=[PostmortemOut.of(p) for p in found],
                        next_after=found[-1].incident_ref if len(found) == limit else None)


@router.get("/v1/incidents/{incident_id}/postmortem", response_model=PostmortemOut,
            responses={200: {"content": {"text/markdown": {}}}, 404: {"description": "no post-mortem yet"}})
def read_postmortem(
    incident_id: Annotated[str, Path(max_length=64, pattern=jobs.INCIDENT_REF.pattern)],
    k: KortexDep,
    tenant: TenantDep,
    accept: Annotated[str | None, Header(max_length=500)] = None,
) -> Response:
    """The incident's latest post-mortem: JSON, or Markdown with `Accept: text/markdown`."""
    found = jobs.postmortem_of(k, tenant.id, incident_id)
    out = PostmortemOut.of(found)
    if accept and "text/markdown" in accept and "application/json" not in accept:
        return PlainTextResponse(out.document.markdown(), media_type="text/markdown; charset=utf-8")
    return JSONResponse(out.model_dump(mode="json"))
