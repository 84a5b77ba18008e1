"""Realistic incident scenarios for the embedded telemetry store (demo, tests, benchmarks).

Each scenario builds its telemetry relative to ``now`` so relative questions ("last hour")
always land on it, from a fixed random seed so every run is the same. Adding one is a
module with a ``build(now, rng)`` plus one entry below.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.engine import Connection

from kortex.errors import InvalidInput
from kortex.telemetry import ingest
from kortex.telemetry.scenarios import archive, checkout, inventory, llm
from kortex.telemetry.scenarios.batch import TelemetryBatch


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    question: str                   # what an operator would ask
    root_cause: str                 # what a good answer names, in words
    key_facts: tuple[str, ...]      # phrases a good answer contains (tests check them)
    build: Callable[[datetime, random.Random], TelemetryBatch]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="checkout-deploy-regression",
            title="checkout slows down after deploy v2.14.0 exhausts its DB connection pool",
            question="Why is checkout slow?",
            root_cause="deploy v2.14.0 of checkout shrank the orders-db connection pool; the pool is exhausted",
            key_facts=("v2.14.0", "connection-pool exhaustion"),
            build=checkout.build,
        ),
        Scenario(
            name="connection-pool-exhaustion",
            title="inventory times out: the stock-reconcile job holds inventory-db's connection pool",
            question="Why is inventory timing out?",
            root_cause="the stock-reconcile batch job holds most of inventory-db's connections (no deploy involved); "
                       "it happened before in INC-0877",
            key_facts=("connection-pool exhaustion", "stock-reconcile", "INC-0877"),
            build=inventory.build,
        ),
        Scenario(
            name="llm-backend-degraded",
            title="gpt-4 requests slow and failing: the AWS backend is degraded",
            question="Why are LLM requests to gpt-4 slow and failing?",
            root_cause="the aws backend is degraded (INC-2207): gpt-4/aws is slow and failing while the router "
                       "still sends gpt-4 traffic there",
            key_facts=("gpt-4/aws", "backend aws", "INC-2207"),
            build=llm.build_backend_degraded,
        ),
        Scenario(
            name="noisy-neighbour",
            title="premium users slowed down by one budget user's bulk job on llama-70b/k8s",
            question="Why are premium users getting slow answers from llama-70b?",
            root_cause="a noisy neighbour: user globex-batch (budget tier) floods llama-70b/k8s and fills its queue",
            key_facts=("noisy neighbour", "globex-batch", "llama-70b/k8s"),
            build=llm.build_noisy_neighbour,
        ),
        Scenario(
            name="incident-archive",
            title="a month of closed incidents across six products (for `kortex postmortem run --since 30d`), "
                  "with checkout's deploy regression live",
            question="Why is checkout slow?",
            root_cause="today: deploy v2.14.0 of checkout exhausts its DB connection pool; the past incidents each "
                       "have their own cause (a deploy, a logged change, a dependency, a resource running out)",
            key_facts=("v2.14.0", "connection-pool exhaustion"),
            build=archive.build,
        ),
    )
}

# Telemetry kinds a scenario replaces; proposals, chats and audit rows are never touched.
REPLACED = tuple(ingest.KINDS)


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise InvalidInput(f"unknown scenario {name!r}; choose from {', '.join(sorted(SCENARIOS))}") from None


def seed(conn: Connection, tenant_id: str, scenario: Scenario, *, now: datetime,
         replace: bool = True, seed_value: int = 7) -> dict[str, int]:
    """Write ``scenario``'s telemetry for ``tenant_id``; ``replace`` clears the tenant's old telemetry."""
    batch = scenario.build(now, random.Random(seed_value))
    if replace:
        for kind in REPLACED:
            table = ingest.KINDS[kind][1]
            conn.execute(delete(table).where(table.c.tenant_id == tenant_id))
    for kind, rows in batch.rows.items():
        ingest.write(conn, tenant_id, kind, rows)
    return batch.counts()


__all__ = ["SCENARIOS", "Scenario", "TelemetryBatch", "get_scenario", "seed"]
