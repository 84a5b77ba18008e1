"""Building blocks scenarios share: a day of healthy history, bystander services, past
incidents, and an LLM platform serving its usual traffic."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta

from kortex.telemetry.scenarios.batch import TelemetryBatch, every, hex_id

HISTORY = timedelta(hours=27)  # 24 h of baseline before a 3 h window
FINE = timedelta(hours=6)      # the recent part, at one sample a minute


def history(batch: TelemetryBatch, rng: random.Random, product: str, now: datetime,
            metrics: dict[str, tuple[float, float, str]]) -> None:
    """Healthy samples every 5 minutes from 27 h ago until 6 h ago: ``name -> (mean, sd, unit)``."""
    for ts in every(now - HISTORY, now - FINE, timedelta(minutes=5)):
        for name, (mean, sd, unit) in metrics.items():
            batch.metric(product, name, ts, max(0.0, rng.gauss(mean, sd)), unit)


def fine_metrics(batch: TelemetryBatch, rng: random.Random, product: str, now: datetime, onset: datetime | None,
                 metrics: dict[str, tuple[Callable[[bool], float], str]]) -> None:
    """One sample a minute over the last 6 h; each metric draws from ``fn(after_onset)``."""
    for ts in every(now - FINE, now, timedelta(minutes=1)):
        bad = onset is not None and ts >= onset
        for name, (draw, unit) in metrics.items():
            batch.metric(product, name, ts, max(0.0, draw(bad)), unit)


def healthy_service(batch: TelemetryBatch, rng: random.Random, product: str, now: datetime, p99: float,
                    hosts: list[str], version: str) -> None:
    """A bystander service: steady metrics, routine logs, its admin info."""
    history(batch, rng, product, now, {"http_request_duration_seconds_p99": (p99, p99 * 0.08, "seconds"),
                                       "http_requests_error_ratio": (0.002, 0.0008, "ratio")})
    fine_metrics(batch, rng, product, now, None, {
        "http_request_duration_seconds_p99": (lambda _b: rng.gauss(p99, p99 * 0.08), "seconds"),
        "http_requests_error_ratio": (lambda _b: rng.gauss(0.002, 0.0008), "ratio"),
    })
    for ts in every(now - timedelta(hours=3), now, timedelta(seconds=45)):
        ms = int(max(5, rng.gauss(p99 * 400, p99 * 60)))
        batch.log(product, ts, "info", f"GET /api/{product} 200 in {ms}ms", host=rng.choice(hosts))
    batch.product(product, {"product": product, "version": version, "health": "ok",
                            "started_at": (now - timedelta(days=4, hours=3)).isoformat(),
                            "build": {"commit": hex_id(rng, 28), "built_at": (now - timedelta(days=5)).isoformat()},
                            "config_hash": hex_id(rng, 64), "config": {"http.workers": 16},
                            "feature_flags": {}}, now - timedelta(seconds=30))


def past_incidents(batch: TelemetryBatch, now: datetime) -> None:
    """Closed incidents every tenant has lying around, unrelated to the scenario at hand."""
    batch.incident("INC-1003", "payments 502s from the card processor", now - timedelta(days=20, hours=4),
                   product="payments", severity="error", closed_at=now - timedelta(days=20, hours=3),
                   findings="502 responses from the card processor's API; our retries amplified the load.",
                   resolution="The processor fixed its gateway; we capped retries at two with jitter.")
    batch.incident("INC-1019", "search slow during index rebuild", now - timedelta(days=9, hours=2),
                   product="search", severity="warn", closed_at=now - timedelta(days=9, hours=1),
                   findings="p99 rose to 900 ms while the nightly index rebuild ran on the primary.",
                   resolution="Moved the rebuild to a replica.")
    batch.incident("INC-0950", "TLS certificate expired on the edge proxy", now - timedelta(days=55),
                   severity="critical", closed_at=now - timedelta(days=55) + timedelta(minutes=50),
                   findings="Clients failed TLS handshakes after the edge certificate expired.",
                   resolution="Renewed the certificate and added expiry alerts 14 days ahead.")


# ---- the LLM platform ---------------------------------------------------------------------

TASKS = ("summarization", "coding", "chat", "extraction")
QUALITY = {"gpt-4": 0.9, "claude-3": 0.91, "llama-70b": 0.84, "mistral-large": 0.82}
PRICE = {"gpt-4": 0.03, "claude-3": 0.015, "llama-70b": 0.004, "mistral-large": 0.008}
# deployment -> (typical p50 ms, share of traffic)
DEPLOYMENTS = {"gpt-4/aws": (320, 0.28), "gpt-4/azure": (340, 0.17), "claude-3/anthropic": (420, 0.2),
               "llama-70b/k8s": (450, 0.23), "mistral-large/neocloud": (380, 0.12)}
SLA = {"premium": 800, "standard": 2000, "budget": 6000}


def llm_users(batch: TelemetryBatch) -> list[tuple[str, str]]:
    users = []
    for i in range(24):
        tier = "premium" if i < 6 else "standard" if i < 16 else "budget"
        user_id = f"user_{101 + i}"
        budget = {"premium": 50.0, "standard": 20.0, "budget": 5.0}[tier]
        batch.llm_user(user_id, tier, SLA[tier], budget)
        users.append((user_id, tier))
    return users


def routing(tier: str, chosen: str, estimates: dict[str, int], unavailable: dict[str, str]) -> dict[str, object]:
    model = chosen.split("/")[0]
    options = []
    for dep, est in estimates.items():
        if dep.split("/")[0] != model:
            continue
        reason = unavailable.get(dep)
        options.append({"deployment": dep, "estimated_latency_ms": None if reason else est,
                        "available": reason is None, **({"reason": reason} if reason else {})})
    return {"user_tier": tier, "latency_sla_ms": SLA[tier], "options_considered": options,
            "decision": f"{chosen}: lowest estimated latency meeting the SLA"}


def llm_request(batch: TelemetryBatch, rng: random.Random, ts: datetime, user: tuple[str, str], deployment: str,
                latency_ms: int, status: str, task: str | None = None) -> str:
    model = deployment.split("/")[0]
    task = task or rng.choice(TASKS)
    tokens_in, tokens_out = rng.randint(300, 3000), rng.randint(50, 800)
    cost = round((tokens_in + tokens_out) / 1000 * PRICE[model], 6)
    request_id = f"req_{hex_id(rng, 48)}"
    quality = None
    if status == "success" and rng.random() < 0.5:
        quality = round(min(1.0, max(0.0, rng.gauss(QUALITY[model], 0.04))), 3)
    estimates = {d: p50 for d, (p50, _s) in DEPLOYMENTS.items()}
    batch.llm_request(request_id=request_id, user_id=user[0], user_tier=user[1], deployment_id=deployment,
                      task_type=task, input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost,
                      latency_ms=latency_ms, status=status, quality_score=quality, router_version="v1.2.0",
                      routing=routing(user[1], deployment, estimates, {}), created_at=ts)
    return request_id


def usual_traffic(batch: TelemetryBatch, rng: random.Random, now: datetime, users: list[tuple[str, str]],
                  per_minute: float,
                  shape: Callable[[datetime, str, int], tuple[int, str]] | None = None) -> None:
    """A day of ordinary requests; ``shape(ts, deployment, latency) -> (latency, status)`` bends it."""
    names = list(DEPLOYMENTS)
    weights = [DEPLOYMENTS[d][1] for d in names]
    step = timedelta(seconds=60 / per_minute)
    for ts in every(now - timedelta(hours=24), now, step):
        ts = ts + timedelta(milliseconds=rng.randint(0, int(step.total_seconds() * 1000) - 1))
        deployment = rng.choices(names, weights)[0]
        p50 = DEPLOYMENTS[deployment][0]
        latency = int(max(40, rng.lognormvariate(0, 0.35) * p50))
        status = "success" if rng.random() > 0.01 else "error"
        if shape is not None:
            latency, status = shape(ts, deployment, latency)
        llm_request(batch, rng, ts, rng.choice(users), deployment, latency, status)


def past_llm_incidents(batch: TelemetryBatch, now: datetime) -> None:
    batch.incident("INC-2101", "gpt-4/aws timeouts during a provider capacity event", now - timedelta(days=17),
                   severity="error", closed_at=now - timedelta(days=17) + timedelta(hours=2),
                   findings="AWS reported reduced GPU capacity; gpt-4/aws p95 passed 5 s and 15% of requests "
                            "timed out while the router kept sending traffic there.",
                   resolution="Drained gpt-4/aws and sent gpt-4 traffic to gpt-4/azure until AWS recovered.",
                   target_type="backend", target_id="aws")
    batch.incident("INC-2150", "mistral-large quality regression after model update", now - timedelta(days=6),
                   severity="warn", closed_at=now - timedelta(days=5),
                   findings="Extraction scores dropped from 0.82 to 0.71 after the provider's model update.",
                   resolution="Pinned the previous model version.", target_type="model", target_id="mistral-large")
