"""``kortex postmortem run`` and ``export``: a batch of post-mortems with a progress bar, then
one file per incident. Embedded (the in-process worker writes them) or against ``--url``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Protocol

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from kortex.errors import InvalidInput, KortexError, NotFound
from kortex_cli.remote import with_fields
from kortex_cli.render import make_console

app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help="Batch post-mortems of past incidents.")
console = make_console()
err = make_console(stderr=True)
USAGE = 2  # Click's exit status for a command line it cannot use
#: The request's fields that an option sets, so a refusal names what to change.
OPTIONS = {"incident_ids": "--ids", "filter.since": "--since", "filter.until": "--until",
           "filter.product": "--product", "filter.severity": "--severity", "model": "--model",
           "max_usd": "--max-usd", "concurrency": "--concurrency"}
ENDED = ("done", "failed", "skipped", "cancelled")
POLL_S = 0.5
#: documents asked for at once (GET /v1/postmortems/{id}/documents pages them, at most 50)
DOCUMENTS_PAGE = 50
#: How long a job may show no item started before the command says what it waits for.
STALL_HINT_S = 30.0
#: Said on stderr when nothing of a job started: with --url the items wait on the ``batch``
#: queue, which a `kortex worker --queues batch` serves; without one the bar stayed at 0 for ever.
NO_BATCH_WORKER = ("no item of job {job} has started after {after:.0f}s: its items wait on the batch queue; "
                   "is a `kortex worker --queues batch` running?")


class Jobs(Protocol):
    """Where a job runs: the embedded stack, or a Kortex API."""

    def submit(self, request: dict[str, Any]) -> str: ...

    def status(self, job_id: str) -> dict[str, Any]: ...

    def items(self, job_id: str) -> list[dict[str, Any]]: ...

    def document(self, incident_id: str, fmt: Literal["md", "json"]) -> str: ...

    def documents(self, job_id: str, fmt: Literal["md", "json"]) -> dict[str, str]: ...

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Stop the job, running items too; the API's answer (``cancelled_queued``, ``running``)."""
        ...


def _render(out: Any, fmt: Literal["md", "json"]) -> str:
    return str(out.document.markdown()) if fmt == "md" else str(out.model_dump_json(indent=2))


class EmbeddedJobs:
    def __init__(self, k: Any, tenant_id: str) -> None:
        self.k, self.tenant_id = k, tenant_id

    def submit(self, request: dict[str, Any]) -> str:
        from kortex.postmortems import jobs
        from kortex_cli.runner import _dispatch

        try:
            submitted = jobs.submit(self.k, self.tenant_id, jobs.JobRequest.model_validate(request), by="cli")
        except ValidationError as exc:  # named field by field, as the API's 422 names them
            details = [{"field": ".".join(str(p) for p in e["loc"]) or "request", "message": e["msg"]}
                       for e in exc.errors()]
            raise InvalidInput(with_fields("the request is not valid", details, OPTIONS), details=details) from None
        except InvalidInput as exc:
            raise InvalidInput(with_fields(exc.message, exc.details, OPTIONS), code=exc.code,
                               details=exc.details) from None
        _dispatch(submitted.handoff)
        return submitted.view.job.id

    def status(self, job_id: str) -> dict[str, Any]:
        from api.routes.postmortems import JobOut
        from kortex.postmortems import jobs

        return JobOut.of(jobs.view(self.k, self.tenant_id, job_id)).model_dump(mode="json")

    def items(self, job_id: str) -> list[dict[str, Any]]:
        from api.routes.postmortems import ItemOut
        from kortex.postmortems import jobs

        return [ItemOut.of(i).model_dump(mode="json") for i in jobs.list_items(self.k, self.tenant_id, job_id,
                                                                               limit=1000)]

    def document(self, incident_id: str, fmt: Literal["md", "json"]) -> str:
        from api.routes.postmortems import PostmortemOut
        from kortex.postmortems import jobs

        return _render(PostmortemOut.of(jobs.postmortem_of(self.k, self.tenant_id, incident_id)), fmt)

    def documents(self, job_id: str, fmt: Literal["md", "json"]) -> dict[str, str]:
        from api.routes.postmortems import PostmortemOut
        from kortex.postmortems import jobs

        out: dict[str, str] = {}
        after: str | None = None
        while True:
            page = jobs.postmortems_of(self.k, self.tenant_id, job_id, after=after, limit=DOCUMENTS_PAGE)
            out.update((p.incident_ref, _render(PostmortemOut.of(p), fmt)) for p in page)
            if len(page) < DOCUMENTS_PAGE:
                return out
            after = page[-1].incident_ref

    def cancel(self, job_id: str) -> dict[str, Any]:
        from kortex.postmortems import jobs
        from kortex_cli.runner import _dispatch

        report, handoff = jobs.cancel(self.k, self.tenant_id, job_id, running="cancel", by="cli")
        _dispatch(handoff)
        return {"cancelled_queued": report.cancelled_queued, "running": report.running}


class RemoteJobs:
    def __init__(self, url: str, api_key: str) -> None:
        import httpx

        self._client = httpx.Client(base_url=url.rstrip("/"), timeout=30.0,
                                    headers={"Authorization": f"Bearer {api_key}"})
        self._broken = False  # said once per command that the API was out of reach

    def _check(self, response: Any) -> Any:
        from kortex_cli.remote import not_kortex, refusal

        if response.status_code >= 400:
            raise refusal(response, OPTIONS)
        if not response.headers.get("content-type", "").startswith(("application/json", "text/markdown")):
            raise KortexError(not_kortex(response))
        return response

    def submit(self, request: dict[str, Any]) -> str:
        return str(self._check(self._client.post("/v1/postmortems", json=request)).json()["job_id"])

    def _get(self, url: str, **kwargs: Any) -> Any:
        """Reads are asked again while the API restarts: the job goes on at the server meanwhile."""
        from kortex_cli.remote import get_patiently

        return self._check(get_patiently(self._client, url, self._said_once, **kwargs))

    def _said_once(self, why: str) -> None:
        if not self._broken:
            self._broken = True
            err.print(f"! the API did not answer ({why}); asking again", markup=False, highlight=False,
                      soft_wrap=True)

    def status(self, job_id: str) -> dict[str, Any]:
        return self._get(f"/v1/postmortems/{job_id}").json()  # type: ignore[no-any-return]

    def items(self, job_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = -1
        while True:
            page = self._get(f"/v1/postmortems/{job_id}/items", params={"after": after, "limit": 500}).json()
            out += page["items"]
            if page["next_after"] is None:
                return out
            after = page["next_after"]

    def document(self, incident_id: str, fmt: Literal["md", "json"]) -> str:
        accept = "text/markdown" if fmt == "md" else "application/json"
        response = self._get(f"/v1/incidents/{incident_id}/postmortem", headers={"Accept": accept})
        return response.text if fmt == "md" else json.dumps(response.json(), indent=2)

    def documents(self, job_id: str, fmt: Literal["md", "json"]) -> dict[str, str]:
        from api.routes.postmortems import PostmortemOut

        out: dict[str, str] = {}
        params: dict[str, Any] = {"limit": DOCUMENTS_PAGE}
        while True:
            page = self._get(f"/v1/postmortems/{job_id}/documents", params=params).json()
            out.update((d["incident_id"], _render(PostmortemOut.model_validate(d), fmt)) for d in page["documents"])
            if page["next_after"] is None:
                return out
            params["after"] = page["next_after"]

    def cancel(self, job_id: str) -> dict[str, Any]:
        # Short: it runs while the user waits to get their prompt back.
        return self._check(self._client.post(f"/v1/postmortems/{job_id}/cancel",  # type: ignore[no-any-return]
                                             params={"running": "cancel"}, timeout=10.0)).json()


def _progress(jobs: Jobs, job_id: str, stall_hint: str | None = None) -> dict[str, Any]:
    """Poll the job until it ends, drawing items done/failed/running, spend and ETA; once, if
    no item has started after ``STALL_HINT_S``, say ``stall_hint`` on stderr."""
    status = jobs.status(job_id)
    since = time.monotonic()
    columns = (TextColumn("[bold]post-mortems[/bold]"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.description}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("", total=max(1, status["items"]))
        while True:
            counts = status["counts"]
            # Dispatched items wait on the batch queue: counted as running, they said "running 4"
            # with no batch worker at all.
            waiting = counts["queued"] + counts["dispatched"]
            bar.update(task, completed=sum(counts[s] for s in ENDED), description=(
                f"done {counts['done']} · failed {counts['failed']} · skipped {counts['skipped']} · "
                f"running {counts['running']} · waiting {waiting} · ${status['spend_usd']:.4f}"))
            if status["finished_at"] is not None:
                return status
            if stall_hint is not None and not _started(counts) and time.monotonic() - since >= STALL_HINT_S:
                err.print(stall_hint.format(job=job_id, after=time.monotonic() - since), markup=False,
                          highlight=False, soft_wrap=True)
                stall_hint = None
            time.sleep(POLL_S)
            status = jobs.status(job_id)


def _started(counts: dict[str, int]) -> bool:
    # Not "skipped": those are settled as the job is made, without a worker.
    return any(counts[s] for s in ("running", "done", "failed"))


def _write(jobs: Jobs, job_id: str, items: list[dict[str, Any]], out: Path,
           fmt: Literal["md", "json"]) -> dict[str, Path]:
    """The job's own documents; and for items skipped because the incident already had one,
    that one (the job was asked for it, and it exists)."""
    out.mkdir(parents=True, exist_ok=True)
    texts = jobs.documents(job_id, fmt)
    for item in items:
        if item["status"] == "skipped" and (item.get("error") or {}).get("code") == "exists":
            try:
                texts.setdefault(item["incident_id"], jobs.document(item["incident_id"], fmt))
            except NotFound:
                continue
    written: dict[str, Path] = {}
    for ref, text in texts.items():
        path = out / f"{_safe(ref)}.{fmt}"
        path.write_text(text)
        written[ref] = path
    return written


def _safe(ref: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in ref)


def _summary(status: dict[str, Any], items: list[dict[str, Any]], written: dict[str, Path]) -> None:
    table = Table(title=f"job {status['id']}: {status['status']}, ${status['spend_usd']:.4f}")
    for column in ("incident", "status", "cost", "file or error"):
        table.add_column(column)
    for item in items:
        error = item.get("error") or {}
        where = str(written.get(item["incident_id"], "")) or str(error.get("message") or error.get("code") or "")
        table.add_row(item["incident_id"], item["status"], f"${item['cost_usd']:.4f}", where)
    console.print(table)


@app.command()
def run(
    since: Annotated[str | None, typer.Option(help="Incidents opened since: '30d', '12h' or ISO 8601")] = None,
    until: Annotated[str | None, typer.Option(help="... and before (default now)")] = None,
    product: Annotated[str | None, typer.Option(help="Only this product's incidents")] = None,
    severity: Annotated[str | None, typer.Option(help="Only this severity: info, warn, error, critical")] = None,
    ids: Annotated[str | None, typer.Option(help="Comma-separated incident ids instead of a filter")] = None,
    model: Annotated[str | None, typer.Option(help="provider:model (default: the configured one)")] = None,
    max_usd: Annotated[float | None, typer.Option(help="Stop the job once it has spent this much")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Items investigated at once")] = 4,
    force: Annotated[bool, typer.Option(help="Redo incidents that already have a post-mortem")] = False,
    out: Annotated[Path, typer.Option(help="Directory for one file per incident")] = Path("postmortems"),
    fmt: Annotated[str, typer.Option("--format", help="md or json")] = "md",
    url: Annotated[str | None, typer.Option(envvar="KORTEX_API_URL", help="A running Kortex API; embedded if unset")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="KORTEX_API_KEY", help="API key for --url")] = None,
    tenant: Annotated[str, typer.Option(help="Tenant whose incidents to use (embedded mode)")] = "demo",
) -> None:
    """Write post-mortems for past incidents, with a progress bar, then a file per incident."""
    if (ids is None) == (since is None):
        _fail("give either --since (with optional --until, --product, --severity) or --ids", USAGE)
    request: dict[str, Any] = {"concurrency": concurrency, "force": force}
    if ids is not None:
        request["incident_ids"] = [i.strip() for i in ids.split(",") if i.strip()]
    else:
        request["filter"] = {k: v for k, v in {"since": since, "until": until, "product": product,
                                               "severity": severity}.items() if v is not None}
    request.update({k: v for k, v in {"model": model, "max_usd": max_usd}.items() if v is not None})
    chosen = _format(fmt)
    with _jobs(url, api_key, tenant) as jobs:
        try:
            job_id = jobs.submit(request)
        except InvalidInput as exc:  # an option's value: said field by field
            _fail(str(exc), USAGE)
        except KortexError as exc:
            _fail(str(exc))
        try:
            console.print(f"job {job_id}")
            status = _progress(jobs, job_id, NO_BATCH_WORKER if url else None)
        except KeyboardInterrupt:
            # As Ctrl-C on `kortex ask` cancels its turn: left alone, the job would go on
            # investigating (and spending) at the server, or in the next embedded command's worker.
            _stopped(jobs, job_id)
        items = jobs.items(job_id)
        written = _write(jobs, job_id, items, out, chosen)
        _summary(status, items, written)
    missing = _unwritten(items, written)
    if missing:
        err.print(missing)
    raise typer.Exit(0 if status["status"] == "done" and not missing else 1)


def _unwritten(items: list[dict[str, Any]], written: dict[str, Path]) -> str | None:
    """What the user asked for and has no file of, in one line; None when every incident has
    one. Exit 0 means that: a script that goes on to publish ./postmortems/ finds them all. An
    incident another job is writing was skipped with exit 0 before, and no file."""
    lacking = [item for item in items if item["incident_id"] not in written]
    if not lacking:
        return None
    why: dict[str, list[str]] = {}
    for item in lacking:
        code = (item.get("error") or {}).get("code") or item["status"]
        why.setdefault(_REASONS.get(code, code), []).append(item["incident_id"])
    said = "; ".join(f"{', '.join(refs)}: {reason}" for reason, refs in why.items())
    return f"{len(lacking)} of {len(items)} post-mortems not written ({said})"


_REASONS = {
    "in_progress": "another job is writing it; run again with --ids once that job ends",
    "budget": "the job's --max-usd was spent",
}


@app.command()
def export(
    job_id: Annotated[str, typer.Argument(help="The job's id")],
    fmt: Annotated[str, typer.Option("--format", help="md or json")] = "md",
    out: Annotated[Path, typer.Option(help="Directory for one file per incident")] = Path("postmortems"),
    url: Annotated[str | None, typer.Option(envvar="KORTEX_API_URL", help="A running Kortex API; embedded if unset")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="KORTEX_API_KEY", help="API key for --url")] = None,
    tenant: Annotated[str, typer.Option(help="Tenant of the job (embedded mode)")] = "demo",
) -> None:
    """Write a job's post-mortems, one file per incident."""
    chosen = _format(fmt)
    with _jobs(url, api_key, tenant, worker=False) as jobs:
        try:
            jobs.status(job_id)  # a job of another tenant, or none, is said so before anything is written
        except KortexError as exc:
            _fail(str(exc))
        written = _write(jobs, job_id, [], out, chosen)  # what the job itself wrote
    console.print(f"wrote {len(written)} post-mortems to {out}")


def _stopped(jobs: Jobs, job_id: str) -> NoReturn:
    """Cancel the job the user interrupted, say how that went on stderr, and exit 130."""
    from kortex_cli.failures import describe
    from kortex_cli.runner import _ignore_sigint

    _ignore_sigint()  # a second Ctrl-C while the job is cancelled would leave it running
    try:
        report = jobs.cancel(job_id)
    except Exception as exc:
        if isinstance(exc, KortexError) and exc.code == "job_finished":
            outcome = f"job {job_id} had already finished"
        else:
            outcome = f"could not cancel job {job_id}: {describe(exc)}"
    else:
        outcome = (f"cancelled job {job_id}: {report.get('cancelled_queued', 0)} items not started, "
                   f"{report.get('running', 0)} running cancelled")
    err.print(f"{outcome} (interrupted)", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(130)


def _format(fmt: str) -> Literal["md", "json"]:
    if fmt not in ("md", "json"):
        _fail("--format must be md or json", USAGE)
    return "md" if fmt == "md" else "json"


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # one line, however narrow the terminal
    raise typer.Exit(code)


class _Opened:
    def __init__(self, url: str | None, api_key: str | None, tenant: str, worker: bool) -> None:
        self.url, self.api_key, self.tenant, self.worker = url, api_key, tenant, worker
        self._stack: Any = None

    def __enter__(self) -> Jobs:
        if self.url:
            if not self.api_key:
                _fail("--api-key (or KORTEX_API_KEY) is required with --url", USAGE)
            return RemoteJobs(self.url, self.api_key or "")
        from kortex.config import load_settings
        from kortex_cli.runner import _tenant_id, embedded_stack

        settings = load_settings()
        self._stack = embedded_stack(settings, worker=self.worker)
        k = self._stack.__enter__()
        try:
            return EmbeddedJobs(k, _tenant_id(k, self.tenant, create=False))
        except NotFound as exc:
            self._stack.__exit__(None, None, None)
            _fail(f"{exc.message}; load incidents first: kortex seed incident-archive --tenant {self.tenant}")

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.__exit__(*exc)


def _jobs(url: str | None, api_key: str | None, tenant: str, worker: bool = True) -> _Opened:
    return _Opened(url, api_key, tenant, worker)

