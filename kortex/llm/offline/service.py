"""The service playbook: probes for a product's telemetry, and what their results add up to.

It surveys before concluding: every metric the product reports (list_products names them) is read
for a step, with the onset, both levels and how many samples the baseline really holds; then the
changes before the onset (deploys, logged flags, migrations, campaigns, a named dependency's
deploys) and the dominant log line become candidate causes, ranked in ``ranking``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kortex.llm.offline.evidence import (
    Cause,
    classify,
    clock,
    culprit,
    fmt_value,
    nearest_deploy,
    parse_ts,
    plural,
)
from kortex.llm.offline.plan import Evidence, Probe, View
from kortex.llm.offline.question import Intent
from kortex.llm.offline.ranking import Hypothesis, kind_of, rank, shared_names, speaks_of
from kortex.telemetry.changepoint import ChangePoint
from kortex.timeparse import isoformat

METRIC_FOR = {
    "latency": "http_request_duration_seconds_p99",
    "errors": "http_requests_error_ratio",
}
METRIC_HINTS = {"latency": ("duration", "latency", "p99"), "errors": ("error", "5xx", "fail")}
METRIC_TOOLS = ("compare_to_baseline", "get_metrics")
MAX_SURVEY = 8       # metrics of one product read for a step
MIN_BASELINE = 30    # baseline samples: a z-score against fewer proves nothing
SAMPLE_SLACK = timedelta(minutes=1)  # an onset is only as precise as a metric's sampling


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


def surveyed(view: View) -> list[str] | None:
    """The product's metrics as list_products named them; None: no survey (no tool, or nothing listed)."""
    survey = view.get("survey")
    names = (survey.content.get("metrics") or []) if survey is not None and survey.ok else []
    return [str(n) for n in names[:MAX_SURVEY]] or None


def unseen(view: View) -> bool:
    """Whether list_products, asked about the product, knows no telemetry that names it."""
    survey = view.get("survey")
    return survey is not None and survey.ok and not survey.content.get("products")


def _known(intent: Intent, view: View) -> dict[str, Any] | None:
    """A product nothing names: list what exists, so the answer can offer the real names."""
    return {} if unseen(view) else None


def _survey_metric(index: int) -> Any:
    def make(intent: Intent, view: View, product: str) -> dict[str, Any] | None:
        names = surveyed(view) or []
        return {"product": product, "metric_name": names[index], "time_range": intent.window} \
            if index < len(names) else None
    return _with_product(make)


def _metric(symptom: str) -> Any:
    """Without a survey, the metric a symptom usually shows in."""
    def make(intent: Intent, view: View, product: str) -> dict[str, Any] | None:
        if surveyed(view) is not None:
            return None
        return {"product": product, "metric_name": METRIC_FOR[symptom], "time_range": intent.window}
    return _with_product(make)


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
    text = found.pattern.example
    for pattern in DEPENDENCY:
        match = pattern.search(text)
        if match and match.group(1) != found.product:
            return match.group(1)
    return None


def _dependency_deploys(intent: Intent, view: View) -> dict[str, Any] | None:
    found = analyse(intent, view)
    other = dependency(found)
    if other is None or (found.linked and (found.cause is None or found.deploy_cause)):  # its own deploy first
        return None
    return {"product": other, "time_range": intent.window}


def _logs(intent: Intent, view: View, product: str) -> dict[str, Any]:
    args: dict[str, Any] = {"product": product, "time_range": intent.window, "level": "warn", "group": True}
    first = analyse(intent, view).first_shift
    if first is not None:
        args["split_at"] = isoformat(first.shift.onset)
    return args


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
    cause = found.deploy_cause
    if found.linked and cause is not None and found.blames("deploy"):
        deploy = found.linked[0]
        return {"action": "rollback-deploy", "product": found.product,
                "params": {"version": deploy["version"], "commit": deploy.get("commit")},
                "rationale": f"{found.product} degraded after deploy {deploy['version']}; "
                             f"the errors point to {cause.name}.",
                "blast_radius": "one service", "reversible": True}
    if found.culprit and found.culprit.startswith("job ") and found.cause:
        job = found.culprit[4:]
        return {"action": "pause-job", "product": found.product, "params": {"job": job},
                "rationale": f"{found.cause.name} on {found.product}: the errors say the connections are held by "
                             f"{found.culprit}.",
                "blast_radius": "one batch job", "reversible": True}
    return None


CHANGE_QUERY = ('|~ "(?i)(feature flag|flag .* (enabled|disabled)|migration|config(uration)? (change|reload)|'
                'rolled (out|back)|campaign|scaled (up|down)|failover)"')


def probes(intent: Intent) -> list[Probe]:
    out = [Probe("trace", ("get_traces",), _trace)]
    product = _with_product
    out.append(Probe("deploys", ("get_recent_deploys",),
                     product(lambda i, v, p: {"product": p, "time_range": i.window}), needs=("trace",)))
    out.append(Probe("survey", ("list_products",), product(lambda i, v, p: {"product": p}), needs=("trace",)))
    out.append(Probe("known", ("list_products",), _known, needs=("survey",)))
    for index in range(MAX_SURVEY):
        out.append(Probe(f"metric:{index}", METRIC_TOOLS, _survey_metric(index), needs=("survey",)))
    for symptom in intent.symptoms:
        out.append(Probe(f"metric:{symptom}", METRIC_TOOLS, _metric(symptom), needs=("trace", "survey")))
    out.append(Probe("admin", ("get_admin_info",), product(lambda i, v, p: {"product": p}), needs=("trace",)))
    # Changes recorded at any level (a flag flipped, a migration applied, a campaign sent): what
    # happened just before a metric moved is the first suspect after a deploy.
    out.append(Probe("changes", ("get_logs",),
                     product(lambda i, v, p: {"product": p, "time_range": i.window, "query": CHANGE_QUERY,
                                              "limit": 20}), needs=("trace",)))
    for symptom in intent.symptoms:
        out.append(Probe(f"metric-alt:{symptom}", METRIC_TOOLS, _alternative(symptom), needs=(f"metric:{symptom}",)))
    metrics = tuple(p.key for p in out if p.key.startswith("metric"))
    # Warnings too: the line that names a cause (a flag flipped, a cache expiring, a slow
    # neighbour) is often a warning, with the errors it causes after it. Read once the metrics
    # are, so the lines are counted before and after the onset.
    out.append(Probe("logs", ("get_logs",), _with_product(_logs), needs=("trace", *metrics)))
    out.append(Probe("history", ("get_incident_history",), _history, needs=("logs",)))
    out.append(Probe("dependency", ("get_recent_deploys",), _dependency_deploys, needs=("logs", "deploys", *metrics)))
    gathered = tuple(p.key for p in out)
    out.append(Probe("propose", ("propose_action",), _remedy, needs=gathered))
    return out


# ---- reading the results ------------------------------------------------------------------


@dataclass
class LogPattern:
    """The most frequent template of the warnings and errors, as get_logs grouped them."""

    template: str
    count: int
    example: str
    first: datetime | None
    last: datetime | None
    host: str | None = None   # the host that wrote most of its lines, when one did (ONE_HOST of them)
    host_count: int = 0
    after: int | None = None  # of its lines, those from the onset on (when the logs were split there)


ONE_HOST = 0.8  # a host writing this share of a template's lines: a fault on one machine


def log_pattern(content: dict[str, Any]) -> LogPattern | None:
    templates = content.get("templates") or []
    if not templates:
        return None
    top = templates[0]
    found = LogPattern(template=str(top["template"]), count=int(top["count"]), example=str(top["example"]),
                       first=parse_ts(top["first_ts"]) if top.get("first_ts") else None,
                       last=parse_ts(top["last_ts"]) if top.get("last_ts") else None,
                       after=int(top["after"]) if top.get("after") is not None else None)
    hosts: list[dict[str, Any]] = top.get("hosts") or []
    if hosts:  # busiest first
        host, count = str(hosts[0]["host"]), int(hosts[0]["count"])
        if count >= ONE_HOST * found.count:
            found.host, found.host_count = host, count
    return found


@dataclass
class Baseline:
    mean: float
    stddev: float
    max_z: float
    samples: int

    @property
    def enough(self) -> bool:
        return self.samples >= MIN_BASELINE


@dataclass
class MetricShift:
    key: str
    evidence: Evidence
    shift: ChangePoint
    unit: str | None
    baseline: Baseline | None

    @property
    def metric(self) -> str:
        return str(self.evidence.call.arguments.get("metric_name", "the metric"))


@dataclass
class ServiceFindings:
    product: str | None
    shifts: list[MetricShift] = field(default_factory=list)
    steady: list[tuple[Evidence, str]] = field(default_factory=list)   # metric, one-line summary
    deploys: list[dict[str, Any]] = field(default_factory=list)
    linked: tuple[dict[str, Any], Any] | None = None
    pattern: LogPattern | None = None
    change: dict[str, Any] | None = None  # a logged change just before the onset (or the latest one)
    log_total: int = 0
    cause: Cause | None = None
    culprit: str | None = None
    incident: dict[str, Any] | None = None

    symptom_hints: tuple[str, ...] = ()
    hypotheses: list[Hypothesis] = field(default_factory=list)   # best first
    no_data: list[Evidence] = field(default_factory=list)   # metric calls that worked and found no samples
    unseen: bool = False        # list_products knows no telemetry that names the product
    known: list[str] = field(default_factory=list)   # the products list_products does know, when unseen

    @property
    def deploy_cause(self) -> Cause | None:
        """The cause the logs name, when the deploy next to the onset could have brought it."""
        return self.cause if self.linked and self.cause is not None and self.cause.deployable else None

    def blames(self, kind: str) -> bool:
        """Whether the best-ranked cause is of this kind (a deploy, a change, ...)."""
        return bool(self.hypotheses) and self.hypotheses[0].kind == kind

    @property
    def main_shift(self) -> MetricShift | None:
        """The metric the question is about when it stepped, else the one that stepped most."""
        if not self.shifts:
            return None
        asked = [s for s in self.shifts if any(h in s.metric for h in self.symptom_hints)]
        return min(asked, key=lambda s: s.shift.onset) if asked else max(self.shifts, key=lambda s: s.shift.ratio)

    @property
    def first_shift(self) -> MetricShift | None:
        """The first metric to move: where the incident starts."""
        return min(self.shifts, key=lambda s: (s.shift.onset, s is not self.main_shift)) if self.shifts else None


def _metric_finding(key: str, ev: Evidence, found: ServiceFindings) -> None:
    content = ev.content
    unit = content.get("unit")
    metric = ev.call.arguments.get("metric_name", "?")
    baseline = None
    if content.get("baseline_mean") is not None:
        baseline = Baseline(float(content["baseline_mean"]), float(content.get("baseline_stddev") or 0.0),
                            float(content.get("max_z_score") or 0.0), int(content.get("baseline_samples") or 0))
    step = content.get("change_point")
    mean = (content.get("stats") or {}).get("mean")
    if step:
        found.shifts.append(MetricShift(key, ev, ChangePoint.from_dict(step), unit, baseline))
    elif mean is not None:
        note = f"steady, mean {fmt_value(float(mean), unit)}, no step change"
        if baseline:
            note += f" ({baseline_text(baseline, unit)})"
        found.steady.append((ev, f"{metric}: {note}"))
    else:
        found.steady.append((ev, f"{metric} ({ev.call.arguments.get('time_range')}): no data"))
        found.no_data.append(ev)


def baseline_text(baseline: Baseline, unit: str | None) -> str:
    if not baseline.enough:
        return f"its 24 h baseline holds only {plural(baseline.samples, 'sample')}, too few to judge by"
    return (f"24 h baseline {fmt_value(baseline.mean, unit)} ± {fmt_value(baseline.stddev, unit)} over "
            f"{baseline.samples} samples, max z {baseline.max_z:.0f}")


def analyse(intent: Intent, view: View) -> ServiceFindings:
    found = ServiceFindings(product=product_of(intent, view),
                            symptom_hints=tuple(h for s in intent.symptoms for h in METRIC_HINTS[s]))
    for key, ev in view.by_key.items():
        if (key.startswith("metric:") or key.startswith("metric-alt:")) and ev.ok:
            _metric_finding(key, ev, found)
    found.unseen = unseen(view)
    found.known = [str(p.get("product")) for p in view.content("known").get("products") or []
                   if isinstance(p, dict) and p.get("product")]
    found.deploys = view.content("deploys").get("deploys") or []
    first = found.first_shift
    if first is not None and view.get("deploys") is not None:
        found.linked = nearest_deploy(found.deploys, first.shift.onset)
    logs = view.content("logs")
    lines = logs.get("lines") or []
    found.log_total = int(logs.get("total_matches") or len(lines))
    found.pattern = log_pattern(logs)
    if found.pattern:
        found.cause = classify(found.pattern.example)
        found.culprit = culprit(found.pattern.example)
    incidents = view.content("history").get("incidents") or []
    found.incident = incidents[0] if incidents else None
    changes = view.content("changes").get("lines") or []
    onset = first.shift.onset if first is not None else None
    before = [c for c in changes if onset is None or parse_ts(c["ts"]) <= onset + timedelta(minutes=1)]
    found.change = max(before, key=lambda c: c["ts"]) if before else None
    found.hypotheses = rank(_candidates(view, found))
    return found


def _candidates(view: View, found: ServiceFindings) -> list[Hypothesis]:
    """Every cause the evidence supports, each with what points at it and what would confirm it."""
    out: list[Hypothesis] = []
    first, main = found.first_shift, found.main_shift
    watch = main.metric if main is not None else "the metric"
    leading = first if first is not None and main is not None and first.shift.onset < main.shift.onset else None
    pattern = found.pattern.example if found.pattern else ""
    deploys, logs, changes = view.get("deploys"), view.get("logs"), view.get("changes")
    if found.linked and deploys is not None:
        deploy = found.linked[0]
        cause = found.deploy_cause
        what = f"{cause.name}, introduced by deploy {deploy['version']}" if cause else \
            f"a change shipped in deploy {deploy['version']}"
        # The errors name a cause no deploy brings (a certificate running out, a disk filling):
        # then only the clock links the deploy to the symptom, which makes it a bystander until
        # something ties the two, and reading its changes, not rolling it back, is the check.
        plausible = found.cause is None or cause is not None
        confirm = (f"roll {found.product} back from {deploy['version']} in one place and watch whether {watch} "
                   "recovers") if plausible else \
            f"read what deploy {deploy['version']} changed; nothing in the evidence ties it to {watch}"
        out.append(Hypothesis(
            f"{what} (landed at {clock(parse_ts(deploy['ts']))}) [{deploys.call.id}]", confirm,
            precedes=plausible, specific=plausible, sources={"deploys", *({"logs"} if cause else set())},
            kind="deploy", classified=cause is not None))
    folded = False  # the leading metric told as part of a cause it corroborates
    if found.change is not None and changes is not None:
        change = found.change
        corroborated = leading is not None and speaks_of(kind_of(leading.metric), change["message"])
        folded |= corroborated
        named = sorted(shared_names(change["message"], pattern), key=lambda n: (-len(n), n))
        sources = {"changes", *({"metrics"} if corroborated else set()), *({"logs"} if named else set())}
        text = f"the change logged at {clock(parse_ts(change['ts']))}: \"{change['message']}\" [{changes.call.id}]"
        if named and logs is not None:
            text += f", and the dominant line names {named[0]} too [{logs.call.id}]"
        if corroborated and leading is not None:
            text += f", with {_moved(leading)} right after"
        out.append(Hypothesis(text, f"revert or pause that change and watch whether {watch} recovers",
                              precedes=onset_after(found, change["ts"]), specific=True, sources=sources,
                              kind="change"))
    other = dependency(found)
    dep = view.get("dependency")
    if other is not None and dep is not None and dep.ok and first is not None:
        near = nearest_deploy(dep.content.get("deploys") or [], first.shift.onset)
        if near is not None:
            out.append(Hypothesis(
                f"{other}'s deploy {near[0]['version']} at {clock(parse_ts(near[0]['ts']))}, named in the dominant "
                f"line [{dep.call.id}]", f"read {other}'s own latency and errors around that deploy",
                precedes=True, specific=True, sources={"deploys", "logs"}, kind="dependency"))
    if found.pattern and logs is not None and not found.deploy_cause:
        kinds = {kind_of(s.metric) for s in found.shifts}
        corroborated = any(speaks_of(k, pattern) for k in kinds if k not in ("latency", "failures"))
        ahead = leading is not None and not folded and speaks_of(kind_of(leading.metric), pattern)
        other = dependency(found)
        if found.cause and found.culprit:
            what = f"{found.cause.name}, with the connections held by {found.culprit}"
        elif found.cause:
            what = found.cause.name
        elif other is not None:
            what = f"{other} failing, as the dominant line says: \"{pattern}\""
        else:
            what = f"what the dominant line says, \"{pattern}\""
        host = f" on host {found.pattern.host}" if found.pattern.host else ""
        if found.cause:  # the words that name the cause, so the conclusion carries its evidence
            host += f", as the dominant line says: \"{pattern}\""
        advice = found.cause.advice if found.cause else (
            f"read {other}'s own errors and logs from the onset on" if other is not None
            else "read the lines just before its first occurrence")
        text = f"{what}{host} [{logs.call.id}]"
        # A line written by the time the first metric moved (within a sample) is the earliest
        # signal there is; one that starts later is more likely an echo of the symptom.
        early = (found.pattern.first is not None and first is not None
                 and found.pattern.first <= first.shift.onset + SAMPLE_SLACK)
        if ahead and leading is not None:
            text += f", with {_moved(leading)}, before {main.metric if main else 'the symptom'}"
        elif early and found.pattern.first is not None and first is not None:
            text += f", first logged at {clock(found.pattern.first)}, by the time {first.metric} moved"
        folded |= ahead
        out.append(Hypothesis(text, advice, precedes=ahead or early,
                              specific=bool(found.pattern.host or found.culprit or found.cause),
                              sources={"logs", *({"metrics"} if corroborated else set())}, kind="logs",
                              classified=found.cause is not None))
    if leading is not None and main is not None and not folded:
        out.append(Hypothesis(
            f"{_moved(leading)}, the first metric to move, before {main.metric}",
            f"find what drove {leading.metric} at {clock(leading.shift.onset)}", precedes=True, specific=False,
            sources={"metrics"}, kind="metric"))
    return out


def _moved(shift: MetricShift) -> str:
    """"incoming traffic (http_requests_rate) up from 400 to 3,900 at 09:25 UTC [call_…]"."""
    kind = kind_of(shift.metric)
    name = f"{kind} ({shift.metric})" if kind else shift.metric
    step = shift.shift
    return (f"{name} {'up' if step.after > step.before else 'down'} from {fmt_value(step.before, shift.unit)} to "
            f"{fmt_value(step.after, shift.unit)} at {clock(step.onset)} [{shift.evidence.call.id}]")


def onset_after(found: ServiceFindings, ts: str) -> bool:
    """Whether a change at ``ts`` landed before the first metric moved."""
    first = found.first_shift
    return first is not None and parse_ts(ts) <= first.shift.onset
