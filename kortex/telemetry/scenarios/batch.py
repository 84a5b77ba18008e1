"""A scenario's telemetry before it is written: rows per ingest kind, built with small helpers."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kortex.telemetry.sources import LEVELS


def every(start: datetime, end: datetime, step: timedelta) -> Iterator[datetime]:
    ts = start
    while ts < end:
        yield ts
        ts += step


def hex_id(rng: random.Random, bits: int = 64) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"


@dataclass
class TelemetryBatch:
    """Rows keyed by ingest kind (see ``kortex.telemetry.ingest.KINDS``)."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def _add(self, kind: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(kind, []).append(row)

    def counts(self) -> dict[str, int]:
        return {kind: len(rows) for kind, rows in self.rows.items()}

    def log(self, product: str, ts: datetime, level: str, message: str, host: str = "",
            trace_id: str | None = None) -> None:
        self._add("logs", {"product": product, "ts": ts, "level": level, "severity": LEVELS[level], "host": host,
                           "message": message, "trace_id": trace_id, "attrs": None})

    def metric(self, product: str, name: str, ts: datetime, value: float, unit: str | None = None,
               labels: dict[str, str] | None = None) -> None:
        self._add("metrics", {"product": product, "metric": name, "ts": ts, "value": value, "unit": unit,
                              "labels": labels or {}})

    def deploy(self, product: str, ts: datetime, version: str, *, actor: str = "ci", host: str = "",
               duration_s: float | None = None, status: str = "ok", commit: str | None = None,
               rolled_back: bool = False) -> None:
        self._add("deploys", {"product": product, "ts": ts, "version": version, "actor": actor, "host": host,
                              "duration_s": duration_s, "status": status, "commit": commit,
                              "rolled_back": rolled_back})

    def span(self, trace_id: str, span_id: str, parent: str | None, service: str, operation: str,
             start: datetime, duration_ms: float, *, error: str | None = None, tags: dict[str, Any] | None = None,
             request_id: str | None = None) -> None:
        self._add("spans", {"trace_id": trace_id, "span_id": span_id, "parent_span_id": parent,
                            "request_id": request_id, "service": service, "operation": operation, "start_ts": start,
                            "duration_us": int(duration_ms * 1000), "status": "error" if error else "ok",
                            "error_message": error, "tags": tags or {}})

    def incident(self, ref: str, title: str, opened_at: datetime, *, product: str | None = None,
                 severity: str = "warn", closed_at: datetime | None = None, findings: str = "",
                 resolution: str = "", target_type: str | None = None, target_id: str | None = None) -> None:
        self._add("incidents", {"ref": ref, "product": product, "title": title, "severity": severity,
                                "opened_at": opened_at, "closed_at": closed_at, "findings": findings,
                                "resolution": resolution, "target_type": target_type, "target_id": target_id})

    def product(self, product: str, info: dict[str, Any], updated_at: datetime) -> None:
        self._add("products", {"product": product, "info": info, "updated_at": updated_at})

    def llm_deployment(self, deployment_id: str, status: str, updated_at: datetime, **fields: Any) -> None:
        model, backend = deployment_id.split("/", 1)
        self._add("llm-deployments", {"deployment_id": deployment_id, "model_id": model, "backend_id": backend,
                                      "status": status, "updated_at": updated_at, "latency_p50_ms": None,
                                      "latency_p95_ms": None, "error_rate": None, "queue_depth": None,
                                      "cost_per_1k_tokens": None, "rate_limit_remaining": None,
                                      "sample_count": 0, **fields})

    def llm_user(self, user_id: str, tier: str, latency_sla_ms: int | None, daily_budget_usd: float | None) -> None:
        self._add("llm-users", {"user_id": user_id, "tier": tier, "latency_sla_ms": latency_sla_ms,
                                "daily_budget_usd": daily_budget_usd})

    def llm_request(self, **row: Any) -> None:
        model, backend = row["deployment_id"].split("/", 1)
        defaults = {"model_id": model, "backend_id": backend, "task_type": "", "input_tokens": 0, "output_tokens": 0,
                    "cost_usd": 0.0, "quality_score": None, "router_version": None, "experiment_id": None,
                    "routing": None}
        self._add("llm-requests", {**defaults, **row})
