"""The offline analyst writing a post-mortem (a ``postmortem`` turn offers ``submit_postmortem``):
investigate the incident's window with the service playbook, read the incident's own record,
then submit a document built only from what those calls returned, each part citing them.

It is rules, not a model: the document says so in its summary, and where the data does not
establish something it says that in ``open_questions`` instead of guessing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kortex.llm.offline import report, service
from kortex.llm.offline.evidence import clock, fmt_value, parse_ts
from kortex.llm.offline.plan import View
from kortex.llm.offline.question import Intent
from kortex.messages import ToolCall, ToolResult

SUBMIT = "submit_postmortem"
SEVERITIES = ("info", "warn", "error", "critical")


@dataclass(frozen=True, slots=True)
class Request:
    incident: dict[str, Any]
    window: str

    @property
    def ref(self) -> str:
        return str(self.incident.get("id") or "unknown")

    @property
    def product(self) -> str | None:
        return self.incident.get("product") or None


def read_request(question: str) -> Request | None:
    """The incident and window a post-mortem turn's request names (kortex/postmortems/jobs.py)."""
    incident: dict[str, Any] | None = None
    window = "last 24h"
    for line in question.splitlines():
        if line.startswith("incident: "):
            try:
                found = json.loads(line.removeprefix("incident: "))
            except ValueError:
                return None
            incident = found if isinstance(found, dict) else None
        elif line.startswith("investigation window: "):
            window = line.removeprefix("investigation window: ").strip()
    return Request(incident, window) if incident else None


def intent_of(request: Request) -> Intent:
    return Intent(product=request.product, symptoms=("latency", "errors"), window=request.window)


def record_call(request: Request) -> ToolCall:
    """The incident's own record, by its title, in its window: what the post-mortem cites for
    when it opened and closed, and how it was resolved."""
    return ToolCall(id="", name="get_incident_history", arguments={
        "query": request.incident.get("title") or request.ref, "time_range": request.window, "limit": 5,
        **({"product": request.product} if request.product else {})})


def _record(calls: list[tuple[ToolCall, ToolResult]], request: Request) -> tuple[str, dict[str, Any]] | None:
    for call, result in calls:
        if call.name != "get_incident_history" or result.is_error or not isinstance(result.content, dict):
            continue
        for incident in result.content.get("incidents") or []:
            if incident.get("id") == request.ref:
                return call.id, incident
    return None


def _cited(view: View, *keys: str) -> list[str]:
    return [view.by_key[k].call.id for k in keys if k in view.by_key and view.by_key[k].ok]


def _at(value: Any) -> datetime | None:
    try:
        return parse_ts(str(value)) if value else None
    except ValueError:
        return None


_CITE = re.compile(r"\[(call_[0-9a-f]+)\]")


def _ids(text: str, succeeded: set[str]) -> list[str]:
    """The calls a sentence cites, in order, that answered."""
    return list(dict.fromkeys(i for i in _CITE.findall(text) if i in succeeded))


def _plain(text: str) -> str:
    """A sentence without its bracketed citations (the document keeps them in ``citations``)."""
    return re.sub(r"\s*\[call_[0-9a-f]+\]", "", text).strip()[:4000]


def document(request: Request, view: View, calls: list[tuple[ToolCall, ToolResult]]) -> dict[str, Any]:
    """The post-mortem, from the evidence only."""
    intent = intent_of(request)
    found = service.analyse(intent, view)
    record = _record(calls, request)
    record_id, record_row = record if record else (None, {})
    anything = [c.id for c, r in calls if not r.is_error and c.name != SUBMIT]
    opened = _at(record_row.get("opened_at")) or _at(request.incident.get("opened_at"))
    closed = _at(record_row.get("closed_at")) or _at(request.incident.get("closed_at"))
    main = found.main_shift
    product = request.product or found.product or "the service"

    timeline: list[dict[str, Any]] = []
    if found.linked and "deploys" in view.by_key:
        deploy = found.linked[0]
        timeline.append({"at": deploy["ts"], "event": f"Deploy {deploy['version']} of {product} landed",
                         "citations": _cited(view, "deploys")})
    if found.change is not None and "changes" in view.by_key:
        timeline.append({"at": found.change["ts"], "event": f"Logged change: {found.change['message'][:300]}",
                         "citations": _cited(view, "changes")})
    if main is not None:
        metric = main.evidence.call.arguments.get("metric_name", "a metric")
        timeline.append({"at": main.shift.onset.isoformat(), "event": (
            f"{metric} moved from {fmt_value(main.shift.before, main.unit)} to {fmt_value(main.shift.after, main.unit)}"),
            "citations": [main.evidence.call.id]})
    if record_id and opened:
        timeline.append({"at": opened.isoformat(), "event": f"Incident {request.ref} opened", "citations": [record_id]})
    if record_id and closed:
        timeline.append({"at": closed.isoformat(), "event": f"Incident {request.ref} closed", "citations": [record_id]})
    timeline.sort(key=lambda e: str(_at(e["at"]) or e["at"]))
    if not timeline and anything and opened:
        timeline.append({"at": opened.isoformat(), "event": f"Incident {request.ref} opened (as the job recorded it)",
                         "citations": anything[:1]})

    open_questions: list[str] = []
    summary = report.summary(intent, view, found).strip()
    succeeded = {c.id for c, r in calls if not r.is_error}
    ranked = found.hypotheses
    if ranked:  # the ranked causes (kortex/llm/offline/ranking.py): the top one, the runner-up after
        top = ranked[0]
        statement = _plain(top.cause)
        root = {"statement": statement[:1].upper() + statement[1:], "citations": _ids(top.cause, succeeded) or anything[:1]}
        open_questions.append(f"To confirm the root cause: {_plain(top.confirm)}")
    elif found.cause is not None:
        evidence = _cited(view, "logs") + ([main.evidence.call.id] if main else [])
        cause = f"{found.cause.name[0].upper()}{found.cause.name[1:]}"
        if found.linked:
            cause += f", introduced by deploy {found.linked[0]['version']}"
            evidence += _cited(view, "deploys")
        if found.pattern:
            cause += f"; the dominant log line reads \"{found.pattern.example[:300]}\""
        root = {"statement": cause + ".", "citations": evidence or anything[:1]}
    elif found.linked:
        root = {"statement": f"A change shipped in deploy {found.linked[0]['version']} of {product}, which landed just "
                             "before the metric moved.", "citations": _cited(view, "deploys") + (
                                 [main.evidence.call.id] if main else [])}
    elif found.change is not None:
        root = {"statement": f"The change the logs record just before the onset: \"{found.change['message'][:300]}\".",
                "citations": _cited(view, "changes")}
    elif record_row.get("findings"):
        root = {"statement": f"As the incident record states: {str(record_row['findings'])[:600]}",
                "citations": [record_id] if record_id else anything[:1]}
        open_questions.append("The telemetry read does not show the cause on its own; the root cause is taken from "
                              "the incident record.")
    else:
        root = {"statement": "Not established: the telemetry read shows no change that explains the incident.",
                "citations": anything[:1]}
        open_questions.append("What changed just before the incident? No deploy, logged change or metric shift was "
                              "found in the window read.")
    if not root["citations"]:
        root["citations"] = anything[:1]

    factors = []
    for runner_up in ranked[1:3]:
        cited = _ids(runner_up.cause, succeeded)
        if cited:
            factors.append({"statement": f"Also considered: {_plain(runner_up.cause)}", "citations": cited})
    if found.pattern and found.pattern.host and "logs" in view.by_key:
        factors.append({"statement": f"The dominant log line came mostly from one host, {found.pattern.host}.",
                        "citations": _cited(view, "logs")})
    if found.culprit and "logs" in view.by_key:
        factors.append({"statement": f"The log lines name {found.culprit} as holding the resource.",
                        "citations": _cited(view, "logs")})

    duration = round((closed - opened).total_seconds() / 60, 1) if opened and closed and closed >= opened else None
    if main is not None:
        magnitude = (f"{main.evidence.call.arguments.get('metric_name', 'the metric')} went from "
                     f"{fmt_value(main.shift.before, main.unit)} to {fmt_value(main.shift.after, main.unit)}")
        impact_cites = [main.evidence.call.id]
    else:
        magnitude = "Not measured: no metric of the product shows a step change in the window read."
        impact_cites = []
        open_questions.append("How many requests or users were affected? The metrics read show no step change.")
    detection = f"Incident {request.ref} was opened at {clock(opened)}" if opened else f"Incident {request.ref} was opened"
    if main is not None and opened is not None:
        lag = (opened - main.shift.onset).total_seconds() / 60
        if lag >= 0:
            detection += f", {lag:.0f} minutes after the metric moved at {clock(main.shift.onset)}"
    detection += "."
    resolution = str(record_row.get("resolution_summary") or "").strip() or "Not recorded in the incident record."
    if not record_id:
        open_questions.append("The incident's own record was not found by get_incident_history, so its resolution is "
                              "not established.")

    actions = []
    if found.linked:
        actions.append({"action": f"Gate {product} deploys on this metric with an automatic rollback",
                        "owner_role": f"{product} on-call", "priority": "P1", "due_in_days": 14})
    if found.cause is not None:
        actions.append({"action": found.cause.advice[0].upper() + found.cause.advice[1:],
                        "owner_role": f"{product} team", "priority": "P1", "due_in_days": 14})
    if main is not None and opened is not None and opened - main.shift.onset > timedelta(minutes=5):
        actions.append({"action": f"Alert on {main.evidence.call.arguments.get('metric_name', 'the metric')} so the "
                                  "change is noticed before users report it",
                        "owner_role": "observability team", "priority": "P2", "due_in_days": 30})
    actions.append({"action": f"Review this post-mortem of {request.ref} with the {product} team",
                    "owner_role": f"{product} team", "priority": "P3", "due_in_days": 7})

    severity = str(request.incident.get("severity") or "error").lower()
    return {
        "title": f"Post-mortem: {request.incident.get('title') or request.ref}"[:300],
        "incident_id": request.ref,
        "product": request.product,
        "severity": severity if severity in SEVERITIES else "error",
        "summary": (f"Written by the offline analyst (rules, no LLM) from the telemetry of {product}. "
                    + (summary or "The telemetry read shows no clear change."))[:4000],
        "impact": {"who": f"Users of {product}", "duration_minutes": duration, "magnitude": magnitude,
                   "citations": impact_cites},
        "timeline": timeline[:50],
        "root_cause": root,
        "contributing_factors": factors,
        "detection": detection,
        "resolution": resolution[:4000],
        "went_well": [f"The incident was recorded and closed ({request.ref})"] if record_id and closed else [],
        "went_badly": ([f"It took {(opened - main.shift.onset).total_seconds() / 60:.0f} minutes to open the incident"]
                       if main is not None and opened is not None and opened - main.shift.onset > timedelta(minutes=5)
                       else []),
        "action_items": actions[:20],
        "open_questions": open_questions[:10],
    }


__all__ = ["Request", "document", "intent_of", "read_request", "record_call"]
