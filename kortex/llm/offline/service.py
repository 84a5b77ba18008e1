"""The service playbook: probes for a product's telemetry, and what their results add up to
(a change in a metric, the deploy next to it, the dominant error, a similar past incident)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kortex.llm.offline.evidence import (
    Cause,
    Shift,
    change_point,
    classify,
    clock,
    culprit,
    dominant_host,
    fmt_us,
    fmt_value,
    nearest_deploy,
    parse_ts,
    top_pattern,
)
from kortex.llm.offline.plan import Evidence, Probe, View
from kortex.llm.offline.question import Intent

METRIC_FOR = {
    "latency": "http_request_duration_seconds_p99",
    "errors": "http_requests_error_ratio",
}
METRIC_HINTS = {"latency": ("duration", "latency", "p99"), "errors": ("error", "5xx", "fail")}
METRIC_TOOLS = ("compare_to_baseline", "get_metrics")


def product_of(intent: Intent, view: View) -> str | None:
    """The product named in the question, else the service at the root of the trace it named."""
    if intent.product:
        return intent.product
    root = view.content("trace").get("root") or {}
    return root.get("service")


def _trace(intent: Intent, view: View) -> dict[str, Any] | None:
    return {"request_id": intent.trace_id, "include_logs": True} if intent.trace_id else None


def _with_product(make: Any) -> Any:
    def build(intent: Intent, view: View) -> dict[str, Any] | None:
        product = product_of(intent, view)
        return make(intent, view, product) if product else None
    return build


def _metric(symptom: str) -> Any:
    return _with_product(lambda i, v, p: {"product": p, "metric_name": METRIC_FOR[symptom], "time_range": i.window})


def _alternative(symptom: str) -> Any:
    """A metric that had no data lists those that exist: try the closest one, once."""
    def make(intent: Intent, view: View, product: str) -> dict[str, Any] | None:
        first = view.get(f"metric:{symptom}")
        if first is None or not first.ok or first.content.get("samples"):
            return None
        for name in first.content.get("available_metrics") or []:
            if name != METRIC_FOR[symptom] and any(h in name for h in METRIC_HINTS[symptom]):
                return {"product": product, "metric_name": name, "time_range": intent.window}
        return None
    return _with_product(make)


# Another product named in the dominant line: the first hop to look at when it is slow or failing.
DEPENDENCY = (
    re.compile(r"\b(?:call|calls|request|requests) to ([a-z][a-z0-9_-]{1,60})\b"),
    re.compile(r"\bupstream ([a-z][a-z0-9_-]{1,60})\b"),
    re.compile(r"\b([a-z][a-z0-9_-]{1,60}) (?:returned|responded|answered) (?:HTTP )?[45]\d\d\b"),
)


def dependency(found: ServiceFindings) -> str | None:
    """The product the dominant warning or error names, if it is another one."""
    if not found.pattern:
        return None
    text = found.pattern[2]
    for pattern in DEPENDENCY:
        match = pattern.search(text)
        if match and match.group(1) != found.product:
            return match.group(1)
    return None


def _dependency_deploys(intent: Intent, view: View) -> dict[str, Any] | None:
    found = analyse(intent, view)
    other = dependency(found)
    if other is None or found.linked:  # its own deploy explains it first
        return None
    return {"product": other, "time_range": intent.window}


def _history(intent: Intent, view: View) -> dict[str, Any] | None:
    found = analyse(intent, view)
    if found.cause is None or not found.product:
        return None
    return {"query": found.cause.search, "product": found.product, "limit": 5}


def _remedy(intent: Intent, view: View) -> dict[str, Any] | None:
    """Propose the obvious remediation when the evidence names one; a human decides."""
    found = analyse(intent, view)
    if not found.product:
        return None
    if found.linked and found.cause:
        deploy = found.linked[0]
        return {"action": "rollback-deploy", "product": found.product,
                "params": {"version": deploy["version"], "commit": deploy.get("commit")},
                "rationale": f"{found.product} degraded {_minutes(found)} after deploy {deploy['version']}; "
                             f"the errors point to {found.cause.name}.",
                "blast_radius": "one service", "reversible": True}
    if found.culprit and found.culprit.startswith("job ") and found.cause:
        job = found.culprit[4:]
        return {"action": "pause-job", "product": found.product, "params": {"job": job},
                "rationale": f"{found.cause.name} on {found.product}: the errors say the connections are held by "
                             f"{found.culprit}.",
                "blast_radius": "one batch job", "reversible": True}
    return None


def _minutes(found: ServiceFindings) -> str:
    if not found.linked:
        return ""
    minutes = int(found.linked[1].total_seconds() // 60)
    return f"{minutes} minutes" if minutes > 0 else "right"


CHANGE_QUERY = ('|~ "(?i)(feature flag|flag .* (enabled|disabled)|migration|config(uration)? (change|reload)|'
                'rolled (out|back)|campaign|scaled (up|down)|failover)"')


def probes(intent: Intent) -> list[Probe]:
    out = [Probe("trace", ("get_traces",), _trace)]
    product = _with_product
    out.append(Probe("deploys", ("get_recent_deploys",),
                     product(lambda i, v, p: {"product": p, "time_range": i.window}), needs=("trace",)))
    for symptom in intent.symptoms:
        out.append(Probe(f"metric:{symptom}", METRIC_TOOLS, _metric(symptom), needs=("trace",)))
    # Warnings too: the line that names a cause (a flag flipped, a cache expiring, a slow
    # neighbour) is often a warning, with the errors it causes after it.
    out.append(Probe("logs", ("get_logs",),
                     product(lambda i, v, p: {"product": p, "time_range": i.window, "level": "warn"}),
                     needs=("trace",)))
    out.append(Probe("admin", ("get_admin_info",), product(lambda i, v, p: {"product": p}), needs=("trace",)))
    # Changes recorded at any level (a flag flipped, a migration applied, a campaign sent): what
    # happened just before a metric moved is the first suspect after a deploy.
    out.append(Probe("changes", ("get_logs",),
                     product(lambda i, v, p: {"product": p, "time_range": i.window, "query": CHANGE_QUERY,
                                              "limit": 20}), needs=("trace",)))
    for symptom in intent.symptoms:
        out.append(Probe(f"metric-alt:{symptom}", METRIC_TOOLS, _alternative(symptom), needs=(f"metric:{symptom}",)))
    out.append(Probe("history", ("get_incident_history",), _history, needs=("logs",)))
    out.append(Probe("dependency", ("get_recent_deploys",), _dependency_deploys, needs=("logs", "deploys")))
    gathered = tuple(p.key for p in out)
    out.append(Probe("propose", ("propose_action",), _remedy, needs=gathered))
    return out


# ---- reading the results ------------------------------------------------------------------


@dataclass
class MetricShift:
    key: str
    evidence: Evidence
    shift: Shift
    unit: str | None
    baseline: tuple[float, float, float] | None  # mean, stddev, max z


@dataclass
class ServiceFindings:
    product: str | None
    shifts: list[MetricShift] = field(default_factory=list)
    steady: list[tuple[Evidence, str]] = field(default_factory=list)   # metric, one-line summary
    deploys: list[dict[str, Any]] = field(default_factory=list)
    linked: tuple[dict[str, Any], Any] | None = None
    pattern: tuple[str, int, str] | None = None
    pattern_host: str | None = None  # the one host writing the dominant line, if one is
    change: dict[str, Any] | None = None  # a logged change just before the onset (or the latest one)
    log_total: int = 0
    cause: Cause | None = None
    culprit: str | None = None
    incident: dict[str, Any] | None = None

    @property
    def main_shift(self) -> MetricShift | None:
        return max(self.shifts, key=lambda s: s.shift.ratio) if self.shifts else None


def _metric_finding(key: str, ev: Evidence, found: ServiceFindings) -> None:
    content = ev.content
    samples = content.get("samples") or []
    unit = content.get("unit")
    metric = ev.call.arguments.get("metric_name", "?")
    shift = change_point(samples)
    baseline = None
    if content.get("baseline_mean") is not None:
        baseline = (float(content["baseline_mean"]), float(content.get("baseline_stddev") or 0.0),
                    float(content.get("max_z_score") or 0.0))
    anomalous = content.get("anomaly_count", 1) if baseline else 1  # get_metrics has no baseline to ask
    if shift and shift.significant and anomalous:
        found.shifts.append(MetricShift(key, ev, shift, unit, baseline))
    elif samples:
        mean = float((content.get("stats") or {}).get("mean") or sum(float(s["value"]) for s in samples) / len(samples))
        note = f"steady, mean {fmt_value(mean, unit)}, no step change"
        if baseline:
            note += f" (24 h baseline {fmt_value(baseline[0], unit)}, {content.get('anomaly_count', 0)} anomalous samples)"
        found.steady.append((ev, f"{metric}: {note}"))
    else:
        found.steady.append((ev, f"{metric} ({ev.call.arguments.get('time_range')}): no data"))


def analyse(intent: Intent, view: View) -> ServiceFindings:
    found = ServiceFindings(product=product_of(intent, view))
    for key, ev in view.by_key.items():
        if (key.startswith("metric:") or key.startswith("metric-alt:")) and ev.ok:
            _metric_finding(key, ev, found)
    found.deploys = view.content("deploys").get("deploys") or []
    main = found.main_shift
    if main is not None and view.get("deploys") is not None:
        found.linked = nearest_deploy(found.deploys, main.shift.onset)
    logs = view.content("logs")
    lines = logs.get("lines") or []
    found.log_total = int(logs.get("total_matches") or len(lines))
    found.pattern = top_pattern(lines)
    if found.pattern:
        found.pattern_host = dominant_host(lines, found.pattern[0])
        found.cause = classify(found.pattern[2])
        found.culprit = culprit(found.pattern[2])
    incidents = view.content("history").get("incidents") or []
    found.incident = incidents[0] if incidents else None
    changes = view.content("changes").get("lines") or []
    onset = main.shift.onset if main is not None else None
    before = [c for c in changes if onset is None or parse_ts(c["ts"]) <= onset + timedelta(minutes=1)]
    found.change = max(before, key=lambda c: c["ts"]) if before else None
    return found


def trace_summary(content: dict[str, Any]) -> str:
    root = content.get("root") or {}
    children = root.get("children") or []
    slowest = max(children, key=lambda c: c.get("duration_us", 0)) if children else None
    text = (f"trace {content.get('trace_id')}: {root.get('service', '?')} {root.get('operation', '?')} took "
            f"{fmt_us(float(root.get('duration_us') or content.get('duration_us') or 0))}")
    if slowest:
        text += f", {fmt_us(float(slowest.get('duration_us', 0)))} of it in '{slowest.get('operation')}'"
        if slowest.get("error"):
            text += f" ({slowest['error']})"
    return text


def admin_summary(content: dict[str, Any], cause: Cause | None) -> str:
    parts = [f"{content.get('product')} reports {content.get('version') or 'no version'}",
             f"health {content.get('health') or 'unknown'}"]
    config = content.get("config") or {}
    if cause is not None:
        parts += [f"{k} = {v}" for k, v in config.items() if cause.config_hint in k.lower()][:3]
    flags = content.get("feature_flags")
    if isinstance(flags, dict) and flags:
        on = [name for name, value in flags.items() if value]
        parts.append(f"feature flags on: {', '.join(on[:8])}" if on else "no feature flag on")
    uptime = content.get("uptime_s")
    if isinstance(uptime, int):
        parts.append(f"up {uptime // 3600} h {uptime % 3600 // 60} min" if uptime >= 3600 else
                     f"up {uptime // 60} min")
    return ", ".join(parts)


def evidence_lines(intent: Intent, view: View, found: ServiceFindings) -> list[str]:
    out: list[str] = []
    for key, ev in view.by_key.items():
        cite = f"[{ev.call.id}]"
        content = ev.content
        if not ev.ok:
            continue
        if key == "trace":
            out.append(f"- {cite} get_traces: {trace_summary(content)}; {len(content.get('errors') or [])} span "
                       "errors.")
        elif key == "deploys":
            listed = ", ".join(f"{d['version']} at {clock(parse_ts(d['ts']))}" for d in found.deploys[:5]) or "none"
            out.append(f"- {cite} get_recent_deploys ({ev.call.arguments.get('time_range')}): {listed}.")
        elif key.startswith("metric"):
            shift = next((s for s in found.shifts if s.key == key), None)
            if shift is not None:
                metric = ev.call.arguments.get("metric_name")
                line = (f"- {cite} {ev.call.name} {metric}: {fmt_value(shift.shift.before, shift.unit)} before "
                        f"{clock(shift.shift.onset)}, {fmt_value(shift.shift.after, shift.unit)} after")
                if shift.baseline:
                    line += (f"; 24 h baseline {fmt_value(shift.baseline[0], shift.unit)} ± "
                             f"{fmt_value(shift.baseline[1], shift.unit)}, {content.get('anomaly_count')} anomalous "
                             f"samples, max z {shift.baseline[2]:.0f}")
                out.append(line + ".")
            else:
                note = next((n for e, n in found.steady if e is ev), "no data")
                out.append(f"- {cite} {ev.call.name} {note}.")
        elif key == "logs":
            level = ev.call.arguments.get("level")
            scope = f"level >= {level}" if level else "all levels"
            if found.pattern:
                shown = len(content.get("lines") or [])
                out.append(f"- {cite} get_logs ({scope}, {ev.call.arguments.get('time_range')}): {found.log_total} "
                           f"matching lines; the most common of the {shown} shown: "
                           f"\"{found.pattern[2]}\".")
            else:
                out.append(f"- {cite} get_logs ({scope}): no matching lines.")
        elif key == "admin":
            out.append(f"- {cite} get_admin_info: {admin_summary(content, found.cause)}.")
        elif key == "dependency":
            listed = ", ".join(f"{d['version']} at {clock(parse_ts(d['ts']))}" for d in (content.get("deploys") or [])[:5])
            out.append(f"- {cite} get_recent_deploys of {ev.call.arguments.get('product')}, named in the logs "
                       f"({ev.call.arguments.get('time_range')}): {listed or 'none'}.")
        elif key == "changes":
            lines = content.get("lines") or []
            latest = max(lines, key=lambda c: c["ts"]) if lines else None
            out.append(f"- {cite} get_logs (changes: flags, migrations, config, campaigns): "
                       + (f"{len(lines)} lines; latest at {clock(parse_ts(latest['ts']))}: \"{latest['message']}\"."
                          if latest else "none recorded."))
        elif key == "history":
            incidents = content.get("incidents") or []
            if incidents:
                top = incidents[0]
                out.append(f"- {cite} get_incident_history \"{ev.call.arguments.get('query')}\": {len(incidents)} "
                           f"match(es); best {top['id']} \"{top['title']}\" ({top['opened_at'][:10]}), resolved by: "
                           f"{top.get('resolution_summary') or 'no resolution recorded'}")
            else:
                out.append(f"- {cite} get_incident_history \"{ev.call.arguments.get('query')}\": no similar incident.")
    return out


def summary(intent: Intent, view: View, found: ServiceFindings) -> str:
    product = found.product
    sentences = []
    trace = view.get("trace")
    if trace is not None and trace.ok:  # asked about one request: that comes first
        sentences.append(f"The requested {trace_summary(trace.content)} [{trace.call.id}].")
    main = found.main_shift
    if main is not None:
        metric = main.evidence.call.arguments.get("metric_name", "the metric")
        text = (f"{product}'s {metric} went from {fmt_value(main.shift.before, main.unit)} to "
                f"{fmt_value(main.shift.after, main.unit)} at {clock(main.shift.onset)}")
        if main.baseline:
            text += f", far outside its 24 h baseline (max z-score {main.baseline[2]:.0f})"
        sentences.append(text + f" [{main.evidence.call.id}].")
        deploys = view.get("deploys")
        if found.linked and deploys is not None:
            deploy = found.linked[0]
            when = f"{_minutes(found)} after" if _minutes(found) != "right" else "right after"
            sentences.append(
                f"That is {when} deploy {deploy['version']} (commit {deploy.get('commit') or 'unknown'}, by "
                f"{deploy.get('actor') or 'unknown'}) landed at {clock(parse_ts(deploy['ts']))} [{deploys.call.id}].")
        elif deploys is not None and deploys.ok:
            sentences.append(f"No deploy of {product} landed near that change [{deploys.call.id}].")
        elif deploys is not None:
            sentences.append(f"I could not check whether a deploy of {product} landed near that change: "
                             f"get_recent_deploys failed (call {deploys.call.id}).")
    else:
        metrics = [ev for k, ev in view.by_key.items() if k.startswith("metric")]
        admin = view.get("admin")
        health = str((admin.content.get("health") if admin is not None and admin.ok else "") or "")
        if any(ev.ok for ev in metrics) and not found.pattern and health not in ("degraded", "down", "unhealthy"):
            logs_ev = view.get("logs")
            parts = [f"I found no step change in {product}'s metrics over the window "
                     + " ".join(f"[{ev.call.id}]" for ev in metrics if ev.ok)]
            if logs_ev is not None and logs_ev.ok:
                parts.append(f"no warning or error lines [{logs_ev.call.id}]")
            if admin is not None and health:
                parts.append(f"it reports health {health} [{admin.call.id}]")
            sentences.append("Nothing abnormal: " + ", ".join(parts) + ".")
        elif any(ev.ok for ev in metrics):
            sentences.append(f"I found no step change in {product}'s metrics over the window.")
        elif metrics:  # every metric query failed: that is no evidence of a steady metric
            sentences.append(f"I could not read {product}'s metrics: "
                             + ", ".join(f"{ev.call.name} failed (call {ev.call.id})" for ev in metrics) + ".")
    logs = view.get("logs")
    if found.pattern and logs is not None:
        where = f", all from host {found.pattern_host}" if found.pattern_host else ""
        sentences.append(f"{found.log_total} warning or error lines since; the dominant one reads \"{found.pattern[2]}\"{where} "
                         f"[{logs.call.id}].")
    other = dependency(found)
    dep = view.get("dependency")
    if other is not None and dep is not None and dep.ok and main is not None:
        near = nearest_deploy(dep.content.get("deploys") or [], main.shift.onset)
        if near is not None:
            d = near[0]
            sentences.append(f"The dominant line points at {other}, which deployed {d['version']} at "
                             f"{clock(parse_ts(d['ts']))}, just before [{dep.call.id}].")
    changes = view.get("changes")
    if found.change is not None and changes is not None:
        host = f" on {found.change['host']}" if found.change.get("host") else ""
        sentences.append(f"Just before, the logs record a change at {clock(parse_ts(found.change['ts']))}{host}: "
                         f"\"{found.change['message']}\" [{changes.call.id}].")
    admin = view.get("admin")
    if admin is not None and admin.ok and found.cause is not None:
        config = admin.content.get("config") or {}
        hinted = [f"{k} = {v}" for k, v in config.items() if found.cause.config_hint in k.lower()]
        if hinted:
            sentences.append(f"Its configuration has {', '.join(hinted[:2])} [{admin.call.id}].")
    history = view.get("history")
    if found.incident and history is not None:
        sentences.append(f"This matches past incident {found.incident['id']} (\"{found.incident['title']}\"), "
                         f"resolved by: {str(found.incident.get('resolution_summary') or '').rstrip('.')} [{history.call.id}].")
    if found.cause and found.linked:
        sentences.append(f"Most likely cause: {found.cause.name}, introduced by deploy {found.linked[0]['version']}.")
    elif found.cause and found.culprit:
        deploys = view.get("deploys")
        no_deploy = deploys is not None and deploys.ok and not found.linked
        sentences.append(f"Most likely cause: {found.cause.name}, with the connections held by {found.culprit}"
                         f"{'; no deploy is involved' if no_deploy else ''}.")
    elif found.cause:
        sentences.append(f"Most likely cause: {found.cause.name}.")
    elif found.linked:
        sentences.append(f"Most likely cause: a change shipped in deploy {found.linked[0]['version']}.")
    return " ".join(sentences)


def next_steps(intent: Intent, found: ServiceFindings) -> list[str]:
    steps = []
    if found.linked:
        steps.append(f"Consider rolling back {found.product} {found.linked[0]['version']} and watch whether the "
                     "metric returns to its earlier level.")
    if found.culprit:
        steps.append(f"Stop or throttle {found.culprit} and confirm the connections are released.")
    if found.cause:
        steps.append(found.cause.advice[0].upper() + found.cause.advice[1:] + ".")
    if not steps:
        steps.append(f"Widen the time window or look at {found.product}'s dependencies.")
    return steps
