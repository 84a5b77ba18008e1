"""Two incidents of the LLM platform Kortex watches:

* backend degraded: AWS GPU capacity drops, gpt-4/aws slows down and fails, and the router keeps
  sending gpt-4 traffic there because its latency estimates lag;
* noisy neighbour: one budget-tier user starts a bulk backfill against llama-70b/k8s, fills its
  queue, and every other user of that deployment (premium ones included) waits.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from kortex.telemetry.scenarios.batch import TelemetryBatch, every
from kortex.telemetry.scenarios.common import (
    DEPLOYMENTS,
    llm_request,
    llm_users,
    past_incidents,
    past_llm_incidents,
    usual_traffic,
)

HEALTHY = {"gpt-4/aws": (310, 540, 0.01), "gpt-4/azure": (330, 580, 0.01), "claude-3/anthropic": (410, 760, 0.008),
           "llama-70b/k8s": (440, 820, 0.012), "mistral-large/neocloud": (370, 690, 0.01)}
COST = {"gpt-4": 0.03, "claude-3": 0.015, "llama-70b": 0.004, "mistral-large": 0.008}


def _deployments(batch: TelemetryBatch, now: datetime, override: dict[str, dict[str, object]]) -> None:
    for dep in DEPLOYMENTS:
        p50, p95, err = HEALTHY[dep]
        fields: dict[str, object] = {"latency_p50_ms": p50, "latency_p95_ms": p95, "error_rate": err,
                                     "queue_depth": 6, "cost_per_1k_tokens": COST[dep.split("/")[0]],
                                     "rate_limit_remaining": 900, "sample_count": 180}
        fields.update(override.get(dep, {}))
        status = str(fields.pop("status", "healthy"))
        batch.llm_deployment(dep, status, now - timedelta(seconds=20), **fields)


def build_backend_degraded(now: datetime, rng: random.Random) -> TelemetryBatch:
    batch = TelemetryBatch()
    onset = now - timedelta(minutes=40)
    users = llm_users(batch)

    def shape(ts: datetime, deployment: str, latency: int) -> tuple[int, str]:
        if deployment != "gpt-4/aws" or ts < onset:
            return latency, "success" if rng.random() > 0.01 else "error"
        roll = rng.random()
        if roll < 0.09:
            return 30_000, "timeout"
        if roll < 0.22:
            return int(rng.uniform(800, 3000)), "error"
        return int(latency * rng.uniform(4.0, 7.0)), "success"

    usual_traffic(batch, rng, now, users, per_minute=4, shape=shape)
    _deployments(batch, now, {"gpt-4/aws": {"status": "degraded", "latency_p50_ms": 1850, "latency_p95_ms": 4600,
                                            "error_rate": 0.19, "queue_depth": 140, "sample_count": 120}})
    batch.incident("INC-2207", "AWS us-east-1: elevated GPU inference latency and 5xx errors", onset + timedelta(
        minutes=2), severity="error", findings="The provider's status page reports degraded GPU capacity in "
                   "us-east-1; gpt-4/aws latency and error rate rose at the same time.",
                   target_type="backend", target_id="aws")
    past_llm_incidents(batch, now)
    past_incidents(batch, now)
    return batch


def build_noisy_neighbour(now: datetime, rng: random.Random) -> TelemetryBatch:
    batch = TelemetryBatch()
    onset = now - timedelta(minutes=50)
    users = llm_users(batch)
    batch.llm_user("globex-batch", "budget", 10_000, 40.0)

    def shape(ts: datetime, deployment: str, latency: int) -> tuple[int, str]:
        if deployment != "llama-70b/k8s" or ts < onset:
            return latency, "success" if rng.random() > 0.01 else "error"
        # Requests queue behind the backfill: four to eight times slower, a few give up.
        if rng.random() < 0.05:
            return 30_000, "timeout"
        return int(latency * rng.uniform(4.0, 8.0)), "success"

    usual_traffic(batch, rng, now, users, per_minute=4, shape=shape)
    for ts in every(onset, now, timedelta(seconds=1.5)):
        latency = int(rng.uniform(1800, 4200))
        status = "success" if rng.random() > 0.04 else "timeout"
        llm_request(batch, rng, ts + timedelta(milliseconds=rng.randint(0, 1400)), ("globex-batch", "budget"),
                    "llama-70b/k8s", 30_000 if status == "timeout" else latency, status, task="extraction")
    _deployments(batch, now, {"llama-70b/k8s": {"status": "degraded", "latency_p50_ms": 2600, "latency_p95_ms": 3900,
                                                "error_rate": 0.05, "queue_depth": 410, "rate_limit_remaining": 0,
                                                "sample_count": 2100}})
    # Open but unrelated: a maintenance window on another backend.
    batch.incident("INC-2211", "neocloud scheduled maintenance (no impact expected)", now - timedelta(hours=2),
                   severity="info", findings="Rolling maintenance of neocloud's control plane.",
                   target_type="backend", target_id="neocloud")
    past_llm_incidents(batch, now)
    past_incidents(batch, now)
    return batch
