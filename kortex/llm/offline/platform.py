"""The LLM-platform playbook: probes over deployments, incidents, requests and users, and what
they add up to (a degraded backend with an incident, or a noisy neighbour filling a queue)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from kortex.llm.offline.evidence import clock, fmt_ms, parse_ts
from kortex.llm.offline.plan import Probe, View
from kortex.llm.offline.question import Intent
from kortex.messages import ToolCall

RANK = {"down": 2, "degraded": 1, "healthy": 0}
NOISY_SHARE = 0.4    # one user sending this much of a deployment's recent traffic is a neighbour problem
NOISY_OVER_FAIR = 1.5  # ... and this many times its fair share (1/users): 40% of two users' traffic is not
FAILING_SHARE = 0.05
RECENT = "1 hour ago"


def focus(intent: Intent, view: View) -> dict[str, Any] | None:
    """The deployment the question is about: the one an asked-about request used, else the worst
    of those the question names, else the worst unhealthy one."""
    deployments: list[dict[str, Any]] = view.content("llm:deployments").get("deployments") or []
    asked = view.content("llm:request").get("request")
    if asked:
        return next((d for d in deployments if d["id"] == asked["deployment_id"]),
                    {"id": asked["deployment_id"], "model_id": asked["model_id"], "backend_id": asked["backend_id"],
                     "status": "unknown"})
    named = [d for d in deployments
             if intent.mentions(d["id"]) or intent.mentions(d["model_id"]) or intent.mentions(d["backend_id"])]
    pool = named or [d for d in deployments if RANK.get(d["status"], 0) > 0]
    if not pool:
        return None
    return max(pool, key=lambda d: (RANK.get(d["status"], 0), d.get("latency_p95_ms") or 0.0, d["id"]))


def _asked(intent: Intent, view: View) -> dict[str, Any] | None:
    return {"request_id": intent.request_id} if intent.request_id else None


def _recent(intent: Intent, view: View) -> dict[str, Any] | None:
    target = focus(intent, view)
    return {"deployment_id": target["id"], "since": RECENT, "limit": 100} if target else None


def _user(intent: Intent, view: View) -> dict[str, Any] | None:
    reqs = analyse_requests(view.content("llm:requests"))
    return {"user_id": reqs.top_user[0]} if reqs.top_user and reqs.noisy else None


def _failed(intent: Intent, view: View) -> dict[str, Any] | None:
    if intent.request_id:
        return None
    reqs = analyse_requests(view.content("llm:requests"))
    return {"request_id": reqs.failed[0]["id"]} if reqs.failed and reqs.error_share >= FAILING_SHARE else None


def _remedy(intent: Intent, view: View) -> dict[str, Any] | None:
    found = analyse(intent, view)
    target = found.focus
    if target is None:
        return None
    if found.kind == "incident":
        alternatives = [d["id"] for d in found.deployments
                        if d["model_id"] == target["model_id"] and d["id"] != target["id"] and d["status"] == "healthy"]
        if alternatives:
            return {"action": "drain-deployment", "product": target["id"],
                    "params": {"deployment_id": target["id"], "route_to": alternatives[0]},
                    "rationale": f"{found.cause}; {alternatives[0]} is healthy and serves the same model.",
                    "blast_radius": f"{target['model_id']} traffic", "reversible": True}
    if found.kind == "noisy" and found.requests.top_user:
        user = found.requests.top_user[0]
        return {"action": "rate-limit-user", "product": target["id"],
                "params": {"user_id": user, "deployment_id": target["id"], "max_requests_per_minute": 10},
                "rationale": f"{found.cause}.", "blast_radius": f"one user ({user})", "reversible": True}
    return None


def probes(intent: Intent) -> list[Probe]:
    window = intent.window
    out = [
        Probe("llm:request", ("get_request_detail",), _asked),
        Probe("llm:deployments", ("get_deployment_status",), lambda i, v: {}),
        Probe("llm:incidents", ("get_active_incidents",), lambda i, v: {}),
        Probe("llm:trends", ("get_latency_trends",), lambda i, v: {"since": window, "granularity": "hour"}),
        Probe("llm:volume", ("get_request_volume",),
              lambda i, v: {"group_by": "tier", "since": window, "granularity": "hour"}),
        Probe("llm:requests", ("get_recent_requests",), _recent, needs=("llm:deployments", "llm:request")),
        Probe("llm:user", ("get_user_context",), _user, needs=("llm:requests",)),
        Probe("llm:failed", ("get_request_detail",), _failed, needs=("llm:requests",)),
    ]
    out.append(Probe("propose", ("propose_action",), _remedy, needs=tuple(p.key for p in out)))
    return out


# ---- reading the results ------------------------------------------------------------------


@dataclass
class Requests:
    """A page of get_recent_requests as its tallies tell it (percentages as the tool wrote them)."""

    count: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)
    failed_pct: float = 0.0
    timeouts: int = 0
    top_user: tuple[str, str, float, int] | None = None  # id, tier, share in percent, count
    users: int = 0                 # distinct users on the page
    top_errors: int = 0            # the busiest user's requests that failed with an error (not a timeout)
    other_errors: int = 0          # everyone else's

    @property
    def error_share(self) -> float:
        return self.failed_pct / 100

    @property
    def errors_spread(self) -> bool:
        """Whether a good share of requests fail with errors, and everyone's fail about as often as
        the busiest user's: the deployment fails them all, whoever sends the most."""
        if self.top_user is None or self.count == 0:
            return False
        errors, top_count = self.top_errors + self.other_errors, self.top_user[3]
        if errors < FAILING_SHARE * self.count:
            return False
        others = self.count - top_count
        if others == 0:
            return True
        return self.other_errors / others >= 0.5 * (self.top_errors / top_count)

    @property
    def noisy(self) -> bool:
        """One user crowding out the others: there are others, it sends well over its fair share,
        and the failures are not the deployment's own (errors every user gets alike)."""
        if self.top_user is None or self.users < 2:
            return False
        share = self.top_user[2]
        return share >= max(NOISY_SHARE * 100, NOISY_OVER_FAIR * 100 / self.users) and not self.errors_spread


def analyse_requests(content: dict[str, Any]) -> Requests:
    rows = content.get("requests") or []
    out = Requests(count=len(rows), failed=[r for r in rows if r.get("status") != "success"],
                   failed_pct=float(content.get("failed_pct") or 0.0),
                   timeouts=int((content.get("by_status") or {}).get("timeout", 0)),
                   users=len({r.get("user_id") for r in rows}))
    busiest = content.get("by_user") or []
    if busiest:
        top = busiest[0]
        out.top_user = (top["user_id"], top["user_tier"], float(top["share_pct"]), int(top["count"]))
        errors = [r for r in rows if r.get("status") == "error"]
        out.top_errors = sum(1 for r in errors if r.get("user_id") == top["user_id"])
        out.other_errors = len(errors) - out.top_errors
    return out


def pct(value: float) -> str:
    """A percentage as the tool wrote it (97.0 -> 97%, 6.5 -> 6.5%)."""
    return f"{value:g}%"


@dataclass
class PlatformFindings:
    deployments: list[dict[str, Any]]
    focus: dict[str, Any] | None
    incident: dict[str, Any] | None = None
    trend: tuple[float, float, float, str] | None = None      # before p95, after p95, ratio, period
    spikes: list[tuple[str, int, float, float, str]] = field(default_factory=list)  # group, n, median, ratio, period
    requests: Requests = field(default_factory=Requests)
    kind: str | None = None   # incident | noisy | unhealthy
    cause: str | None = None


def _read(view: View, key: str) -> bool:
    """Whether the probe ran and its call succeeded: only then is an empty result evidence."""
    found = view.get(key)
    return found is not None and found.ok


def _incident_for(target: dict[str, Any], incidents: list[dict[str, Any]]) -> dict[str, Any] | None:
    keys = {("deployment", target["id"]), ("backend", target["backend_id"]), ("model", target["model_id"])}
    return next((i for i in incidents if (i.get("target_type"), i.get("target_id")) in keys), None)


def _trend(rows: list[dict[str, Any]], deployment: str) -> tuple[float, float, float, str] | None:
    mine = sorted((r for r in rows if r["deployment_id"] == deployment and r["request_count"] >= 3),
                  key=lambda r: r["period"])
    if len(mine) < 2:
        return None
    worst = max(mine[1:], key=lambda r: r["latency_p95_ms"])
    before = statistics.median_low(r["latency_p95_ms"] for r in mine if r is not worst)
    ratio = worst["latency_p95_ms"] / before if before else 0.0
    return (before, worst["latency_p95_ms"], ratio, worst["period"]) if ratio >= 1.5 else None


def _spikes(rows: list[dict[str, Any]]) -> list[tuple[str, int, float, float, str]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    out = []
    for group, items in sorted(groups.items()):
        if len(items) < 3:
            continue
        peak = max(items, key=lambda r: r["request_count"])
        median = statistics.median_low(r["request_count"] for r in items if r is not peak)
        if median and peak["request_count"] / median >= 3:
            out.append((group, peak["request_count"], median, peak["request_count"] / median, peak["period"]))
    return out


def analyse(intent: Intent, view: View) -> PlatformFindings:
    found = PlatformFindings(deployments=view.content("llm:deployments").get("deployments") or [],
                             focus=focus(intent, view))
    found.requests = analyse_requests(view.content("llm:requests"))
    found.spikes = _spikes(view.content("llm:volume").get("data") or [])
    target = found.focus
    if target is None:
        return found
    found.incident = _incident_for(target, view.content("llm:incidents").get("incidents") or [])
    found.trend = _trend(view.content("llm:trends").get("data") or [], target["id"])
    reqs = found.requests
    top = reqs.top_user
    if found.incident:
        found.kind = "incident"
        found.cause = (f"{found.incident['target_type']} {found.incident['target_id']} is degraded "
                       f"({found.incident['id']}: {found.incident['title']}), and {target['id']} with it")
    elif top and reqs.noisy and view.get("llm:requests") is not None:
        found.kind = "noisy"
        found.cause = (f"a noisy neighbour: user {top[0]} ({top[1]} tier) sent {pct(top[2])} of the recent requests "
                       f"to {target['id']} and fills its queue, so every other user of it waits")
    elif RANK.get(target.get("status", ""), 0) > 0:
        found.kind = "unhealthy"
        unread = [what for key, what in (("llm:incidents", "open incidents"), ("llm:requests", "its recent requests"))
                  if not _read(view, key)]
        if unread:  # an absence is only evidence when the call that would show it worked
            found.cause = (f"{target['id']} is {target['status']}; I could not read {' or '.join(unread)}, so what "
                           "explains it is still open")
        elif reqs.errors_spread or (top and reqs.users < 2):
            why = (f"its only recent user, {top[0]}, has no neighbour to crowd out" if top and reqs.users < 2
                   else "its errors hit every user alike, so no one user is to blame")
            found.cause = f"{target['id']} is {target['status']} by itself: no open incident explains it, and {why}"
        else:
            found.cause = f"{target['id']} is {target['status']}; neither an open incident nor one user explains it"
    return found


def _deployment_text(d: dict[str, Any]) -> str:
    parts = [f"p95 {fmt_ms(float(d.get('latency_p95_ms') or 0))}"]
    if d.get("error_rate") is not None:
        parts.append(f"error rate {float(d['error_rate']):.0%}")
    if d.get("queue_depth") is not None:
        parts.append(f"queue depth {d['queue_depth']}")
    if d.get("rate_limit_remaining") is not None and d["rate_limit_remaining"] < 50:
        parts.append(f"rate limit remaining {d['rate_limit_remaining']}")
    return ", ".join(parts)


def _routing_text(detail: dict[str, Any]) -> str:
    request = detail.get("request") or {}
    routing = request.get("routing_decision") or {}
    chosen = next((o for o in routing.get("options_considered") or [] if o.get("deployment") == request.get(
        "deployment_id")), None)
    text = (f"request {request.get('id')} ({request.get('status')}, {fmt_ms(float(request.get('latency_ms') or 0))}) "
            f"went to {request.get('deployment_id')}")
    if chosen and chosen.get("estimated_latency_ms") is not None:
        text += f"; the router estimated {fmt_ms(float(chosen['estimated_latency_ms']))} for it"
    if routing.get("decision"):
        text += f" (\"{routing['decision']}\")"
    return text


def evidence_lines(intent: Intent, view: View, found: PlatformFindings) -> list[str]:
    out: list[str] = []
    for key, ev in view.by_key.items():
        if not ev.ok or key == "propose":
            continue
        cite, content = f"[{ev.call.id}]", ev.content
        if key == "llm:deployments":
            summary = content.get("summary") or {}
            bad = [f"{d['id']} {d['status']} ({_deployment_text(d)})" for d in found.deployments
                   if RANK.get(d["status"], 0) > 0]
            out.append(f"- {cite} get_deployment_status: {summary.get('total', 0)} deployments, "
                       f"{summary.get('healthy', 0)} healthy; " + ("; ".join(bad) if bad else "none unhealthy") + ".")
        elif key == "llm:incidents":
            listed = "; ".join(f"{i['id']} on {i.get('target_type')} {i.get('target_id')}: \"{i['title']}\""
                               for i in content.get("incidents") or []) or "none"
            out.append(f"- {cite} get_active_incidents: {listed}.")
        elif key == "llm:trends":
            if found.trend and found.focus:
                before, after, ratio, period = found.trend
                out.append(f"- {cite} get_latency_trends ({ev.call.arguments.get('since')}): {found.focus['id']} p95 "
                           f"{fmt_ms(after)} in the hour from {clock(parse_ts(period))} against a median of "
                           f"{fmt_ms(before)}.")
            else:
                summary = content.get("summary") or {}
                out.append(f"- {cite} get_latency_trends: {summary.get('total_requests', 0)} requests, average p95 "
                           f"{fmt_ms(float(summary.get('avg_latency_p95_ms') or 0))}, no deployment stands out.")
        elif key == "llm:volume":
            spikes = "; ".join(f"{g} tier: {n} requests in the hour from {clock(parse_ts(p))} against a median of "
                               f"{m:.0f}" for g, n, m, _r, p in found.spikes) or "no tier stands out"
            out.append(f"- {cite} get_request_volume (by tier, {ev.call.arguments.get('since')}): {spikes}.")
        elif key == "llm:requests":
            reqs = found.requests
            text = (f"- {cite} get_recent_requests ({ev.call.arguments.get('deployment_id')}, since {RECENT}): "
                    f"{reqs.count} requests, {pct(reqs.failed_pct)} failed ({reqs.timeouts} timeouts)")
            if reqs.top_user:
                user, tier, share, count = reqs.top_user
                text += f"; busiest user {user} ({tier}) with {count} ({pct(share)})"
            out.append(text + ".")
        elif key == "llm:user":
            account = content.get("user") or {}
            budget = account.get("daily_budget_usd")
            spent = (f"${account.get('daily_budget_used_usd')} of a ${budget} daily budget used" if budget is not None
                     else "no daily budget set")
            out.append(f"- {cite} get_user_context {account.get('id')}: {account.get('tier')} tier, "
                       f"{account.get('requests_today')} requests today, {spent}.")
        elif key in ("llm:failed", "llm:request"):
            related = content.get("related_incident")
            text = f"- {cite} get_request_detail: {_routing_text(content)}"
            if related:
                text += f"; open incident at the time: {related['id']}"
            out.append(text + ".")
    return out


def summary(intent: Intent, view: View, found: PlatformFindings,
            known: tuple[ToolCall, list[str]] | None = None) -> str:
    """``known``: the products list_products named this turn, offered when the platform is empty."""
    target = found.focus
    deployments = view.get("llm:deployments")
    if target is None:
        if deployments is None:
            return "I could not read the state of the LLM platform's deployments."
        if not deployments.ok:
            return (f"I could not read the state of the LLM platform's deployments: get_deployment_status failed "
                    f"[{deployments.call.id}], so I cannot say whether any is unhealthy.")
        if not found.deployments:  # nothing reported is no evidence of health
            text = (f"The LLM platform has reported no deployments [{deployments.call.id}], so there is no "
                    "LLM-platform data to judge by.")
            if known is not None and known[1]:
                text += (f" If the question is about a service, the telemetry names these products: "
                         f"{', '.join(known[1][:20])} [{known[0].id}].")
            return text
        return f"All {len(found.deployments)} deployments of the LLM platform report healthy [{deployments.call.id}]."
    sentences = []
    if deployments is not None and deployments.ok and target.get("status") != "unknown":
        sentences.append(f"Deployment {target['id']} is {target['status']}: {_deployment_text(target)} "
                         f"[{deployments.call.id}].")
    trends = view.get("llm:trends")
    if found.trend and trends is not None:
        before, after, ratio, period = found.trend
        sentences.append(f"Its p95 latency rose from {fmt_ms(before)} to {fmt_ms(after)} in the hour "
                         f"from {clock(parse_ts(period))} [{trends.call.id}].")
    incidents = view.get("llm:incidents")
    if found.incident and incidents is not None:
        sentences.append(f"{found.incident['target_type'].capitalize()} {found.incident['target_id']} has an open "
                         f"incident, {found.incident['id']} \"{found.incident['title']}\", for "
                         f"{found.incident['duration_minutes']} minutes [{incidents.call.id}].")
    elif incidents is not None and incidents.ok:
        sentences.append(f"No open incident concerns {target['id']} [{incidents.call.id}].")
    elif incidents is not None:
        sentences.append(f"I could not check for open incidents: get_active_incidents failed [{incidents.call.id}].")
    recent = view.get("llm:requests")
    reqs = found.requests
    if recent is not None and reqs.count:
        text = f"Of its last {reqs.count} requests {pct(reqs.failed_pct)} failed ({reqs.timeouts} timeouts)"
        if found.kind == "noisy" and reqs.top_user:
            user, tier, share, count = reqs.top_user
            text += f", and {count} ({pct(share)}) came from one user, {user} ({tier} tier)"
        sentences.append(text + f" [{recent.call.id}].")
    account = view.get("llm:user")
    if account is not None and account.ok:
        info = account.content.get("user") or {}
        sentences.append(f"{info.get('id')} has sent {info.get('requests_today')} requests today "
                         f"[{account.call.id}].")
    volume = view.get("llm:volume")
    if found.spikes and volume is not None:
        group, n, median, ratio, period = max(found.spikes, key=lambda s: s[3])
        sentences.append(f"The {group} tier's traffic jumped to {n} requests in the hour from "
                         f"{clock(parse_ts(period))}, against a median of {median:.0f} [{volume.call.id}].")
    for key in ("llm:request", "llm:failed"):
        detail = view.get(key)
        if detail is not None and detail.ok:
            sentences.append(f"For example, {_routing_text(detail.content)} [{detail.call.id}].")
    if found.cause:
        sentences.append(f"Most likely cause: {found.cause}.")
    return " ".join(sentences)


def next_steps(intent: Intent, found: PlatformFindings) -> list[str]:
    target = found.focus
    if target is None and not found.deployments:
        return ["Send the LLM platform's deployment status to Kortex, or name the service the question is about."]
    if target is None:
        return ["Ask about a specific model, backend or request id."]
    if found.kind == "incident":
        return [f"Route {target['model_id']} traffic away from {target['id']} until the incident is resolved; the "
                "router's latency estimates lag behind the backend's real latency.",
                f"Follow {found.incident['id'] if found.incident else 'the incident'} for the provider's recovery."]
    if found.kind == "noisy" and found.requests.top_user:
        user = found.requests.top_user[0]
        return [f"Rate-limit or queue {user} separately so its bulk job stops starving {target['id']}.",
                "Give premium traffic its own capacity or priority on shared deployments."]
    return [f"Look at {target['id']}'s backend for capacity or errors; widen the window to see when it started."]
