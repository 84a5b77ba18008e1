"""The service findings written as the answer: its summary (what moved, when, next to which
change, the ranked causes), one evidence line per call, and the suggested next steps. The
reading of the results is kortex/llm/offline/service.py; this is only their wording."""

from __future__ import annotations

from typing import Any

from kortex.llm.offline.evidence import (
    Cause,
    clock,
    fmt_us,
    fmt_value,
    parse_ts,
    plural,
)
from kortex.llm.offline.plan import View
from kortex.llm.offline.question import Intent
from kortex.llm.offline.service import (
    LogPattern,
    MetricShift,
    ServiceFindings,
    baseline_text,
)


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
                step = shift.shift
                line = (f"- {cite} {ev.call.name} {shift.metric}: {fmt_value(step.before, shift.unit)} over "
                        f"{step.before_samples} samples before {clock(step.onset)}, "
                        f"{fmt_value(step.after, shift.unit)} over {step.after_samples} after")
                if shift.baseline:
                    line += f"; {baseline_text(shift.baseline, shift.unit)}"
                out.append(line + ".")
            else:
                note = next((n for e, n in found.steady if e is ev), "no data")
                out.append(f"- {cite} {ev.call.name} {note}.")
        elif key == "logs":
            level = ev.call.arguments.get("level")
            scope = f"level >= {level}" if level else "all levels"
            if found.pattern:
                out.append(f"- {cite} get_logs ({scope}, {ev.call.arguments.get('time_range')}): {found.log_total} "
                           f"matching lines in {plural(len(content.get('templates') or []), 'template')}; the "
                           f"most common, {_span(found.pattern)}: \"{found.pattern.template}\".")
            else:
                out.append(f"- {cite} get_logs ({scope}): no matching lines.")
        elif key == "survey" and found.unseen:
            out.append(f"- {cite} list_products {ev.call.arguments.get('product')}: no telemetry names it.")
        elif key == "survey":
            out.append(f"- {cite} list_products {ev.call.arguments.get('product')}: "
                       f"{plural(len(content.get('metrics') or []), 'metric')}, each read for a step.")
        elif key == "known":
            out.append(f"- {cite} list_products: {plural(len(found.known), 'product')}"
                       + (f": {', '.join(found.known[:20])}." if found.known else "."))
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
    sentences = []
    trace = view.get("trace")
    if trace is not None and trace.ok:  # asked about one request: that comes first
        sentences.append(f"The requested {trace_summary(trace.content)} [{trace.call.id}].")
    main = found.main_shift
    if main is not None:
        sentences += _shifts_text(found, main)
        sentences += _deploy_text(view, found)
    else:
        sentences += _steady_text(view, found)
    logs = view.get("logs")
    if found.pattern and logs is not None:
        pattern = found.pattern
        where = f", {pattern.host_count} of them from host {pattern.host}" if pattern.host else ""
        split = logs.content.get("after_split")
        if split is not None and logs.content.get("split_at") and pattern.after is not None:
            at = clock(parse_ts(str(logs.content["split_at"])))
            count = (f"Since {at}, when the first metric moved, {plural(int(split), 'warning or error line')} "
                     f"({logs.content.get('before_split')} before); the dominant one, {_span(pattern)} "
                     f"({pattern.after} of them since {at}),")
        else:
            count = f"{found.log_total} warning or error lines in the window; the dominant one, {_span(pattern)},"
        sentences.append(f"{count} reads \"{pattern.example}\"{where} [{logs.call.id}].")
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
    sentences += _ranking_text(view, found)
    return " ".join(sentences)


def _span(pattern: LogPattern) -> str:
    """"147 lines from 09:09 to 09:44 UTC"."""
    if pattern.first is None or pattern.last is None:
        return plural(pattern.count, "line")
    return f"{plural(pattern.count, 'line')} from {pattern.first.strftime('%H:%M')} to {clock(pattern.last)}"


def _shifts_text(found: ServiceFindings, main: MetricShift) -> list[str]:
    step = main.shift
    text = (f"{found.product}'s {main.metric} went from {fmt_value(step.before, main.unit)} to "
            f"{fmt_value(step.after, main.unit)} at {clock(step.onset)} ({step.before_samples} samples before, "
            f"{step.after_samples} after)")
    if main.baseline is not None and main.baseline.enough and abs(main.baseline.max_z) >= 3:
        text += (f", far outside its 24 h baseline of {main.baseline.samples} samples (max z-score "
                 f"{main.baseline.max_z:.0f})")
    elif main.baseline is not None:
        text += f"; {baseline_text(main.baseline, main.unit)}"
    out = [text + f" [{main.evidence.call.id}]."]
    others = sorted((s for s in found.shifts if s is not main), key=lambda s: s.shift.onset)
    if others:
        out.append("Other metrics stepped too: " + "; ".join(
            f"{s.metric} from {fmt_value(s.shift.before, s.unit)} to {fmt_value(s.shift.after, s.unit)} at "
            f"{clock(s.shift.onset)}{' (first to move)' if s is found.first_shift else ''} [{s.evidence.call.id}]"
            for s in others) + ".")
    return out


def _deploy_text(view: View, found: ServiceFindings) -> list[str]:
    deploys = view.get("deploys")
    if deploys is None:
        return []
    if found.linked:
        deploy = found.linked[0]
        return [f"That is just after deploy {deploy['version']} (commit {deploy.get('commit') or 'unknown'}, by "
                f"{deploy.get('actor') or 'unknown'}) landed at {clock(parse_ts(deploy['ts']))} [{deploys.call.id}]."]
    if deploys.ok:
        return [f"No deploy of {found.product} landed near that change [{deploys.call.id}]."]
    return [f"I could not check whether a deploy of {found.product} landed near that change: "
            f"get_recent_deploys failed (call {deploys.call.id})."]


def _steady_text(view: View, found: ServiceFindings) -> list[str]:
    product = found.product
    metrics = [ev for k, ev in view.by_key.items() if k.startswith("metric")]
    admin = view.get("admin")
    health = str((admin.content.get("health") if admin is not None and admin.ok else "") or "")
    logs_ev = view.get("logs")
    survey, known = view.get("survey"), view.get("known")
    # No data is no evidence of a steady product: say what is missing instead of "nothing abnormal".
    if found.unseen and survey is not None:
        text = (f"I found no telemetry of {product} to judge by: list_products knows no metrics, logs, deploys, "
                f"admin info or incidents that name it [{survey.call.id}]")
        if found.known and known is not None:
            text += f". The telemetry names these products: {', '.join(found.known[:20])} [{known.call.id}]"
        return [text + "."]
    read = [ev for ev in metrics if ev.ok]
    cited = " ".join(f"[{ev.call.id}]" for ev in read)
    if read and all(ev in found.no_data for ev in read):
        if not found.pattern and logs_ev is not None and logs_ev.ok and not health:
            return [f"I found no telemetry of {product} to judge by: its metrics hold no samples over the window "
                    f"{cited}, and it wrote no warning or error lines [{logs_ev.call.id}]."]
        reported = f", though it reports health {health} [{admin.call.id}]" if admin is not None and health else ""
        return [f"{product}'s metrics hold no samples over the window {cited}{reported}."]
    if read and not found.pattern and health not in ("degraded", "down", "unhealthy"):
        parts = [f"I found no step change in {product}'s metrics over the window {cited}"]
        if logs_ev is not None and logs_ev.ok:
            parts.append(f"no warning or error lines [{logs_ev.call.id}]")
        if admin is not None and health:
            parts.append(f"it reports health {health} [{admin.call.id}]")
        return ["Nothing abnormal: " + ", ".join(parts) + "."]
    if read:
        return [f"I found no step change in {product}'s metrics over the window."]
    if metrics:  # every metric query failed: that is no evidence of a steady metric
        return [f"I could not read {product}'s metrics: "
                + ", ".join(f"{ev.call.name} failed (call {ev.call.id})" for ev in metrics) + "."]
    return []


def _ranking_text(view: View, found: ServiceFindings) -> list[str]:
    if not found.hypotheses:
        return []
    top = found.hypotheses[0]
    # A cause only the dominant line suggests, with nothing before the onset, is a lead, not a finding.
    lead = "Most likely cause" if top.precedes or found.cause or len(top.sources) > 1 else "Leading hypothesis"
    out = [f"{lead}: {top.cause}."]
    if found.cause and found.culprit and not found.linked:
        deploys = view.get("deploys")
        if deploys is not None and deploys.ok:
            out[-1] = out[-1][:-1] + "; no deploy is involved."
    out.append(f"To confirm it: {top.confirm}.")
    if len(found.hypotheses) > 1:
        second = found.hypotheses[1]
        out.append(f"Runner-up: {second.cause}; to confirm it instead: {second.confirm}.")
    return out


def next_steps(intent: Intent, found: ServiceFindings) -> list[str]:
    steps = []
    if found.unseen and intent.product:
        return [f"Check the name against the products the telemetry names, or send {found.product}'s telemetry to "
                "Kortex; there is nothing of it to investigate yet."]
    if found.unseen:  # named by the trace, not the question
        return [f"Send {found.product}'s metrics and logs to Kortex to see beyond this one trace."]
    if found.linked and found.blames("deploy"):
        steps.append(f"Consider rolling back {found.product} {found.linked[0]['version']} and watch whether the "
                     "metric returns to its earlier level.")
    if found.culprit:
        steps.append(f"Stop or throttle {found.culprit} and confirm the connections are released.")
    if found.cause:
        steps.append(found.cause.advice[0].upper() + found.cause.advice[1:] + ".")
    if not steps:
        steps.append(f"Widen the time window or look at {found.product}'s dependencies.")
    return steps
