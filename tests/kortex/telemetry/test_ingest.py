"""Ingest validation: every value that reaches a column fits it, and every refusal names its field."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import BigInteger, Float, Integer

from kortex.errors import InvalidInput
from kortex.telemetry import ingest
from kortex.timeparse import isoformat, utcnow

NOW = utcnow()
TS = isoformat(NOW - timedelta(minutes=1))

GOOD: dict[str, dict[str, Any]] = {
    "logs": {"product": "checkout", "ts": TS, "level": "error", "message": "m"},
    "metrics": {"product": "checkout", "metric": "latency_ms", "ts": TS, "value": 1.0},
    "spans": {"trace_id": "t1", "span_id": "s1", "service": "checkout", "operation": "op", "start": TS,
              "duration_us": 5},
    "deploys": {"product": "checkout", "ts": TS, "version": "v1"},
    "incidents": {"ref": "INC-1", "title": "t", "opened_at": TS},
    "products": {"product": "checkout", "info": {"v": 1}, "updated_at": TS},
    "llm-deployments": {"deployment_id": "vllm/dep-1", "model_id": "m1", "backend_id": "b1", "status": "healthy",
                        "updated_at": TS},
    "llm-users": {"user_id": "u1", "tier": "premium"},
    "llm-requests": {"request_id": "r1", "user_id": "u1", "user_tier": "premium", "deployment_id": "vllm/dep-1",
                     "model_id": "m1", "backend_id": "b1", "latency_ms": 5, "status": "success", "created_at": TS},
}
COLUMN_MAX = {Integer: 2**31 - 1, BigInteger: 2**63 - 1}


def _fields_of(kind: str, column_type: type) -> list[str]:
    """The item fields of ``kind`` stored in a column of ``column_type``."""
    model, table, *_ = ingest.KINDS[kind]
    return [name for name in model.model_fields
            if name in table.c and type(table.c[name].type) is column_type]


def _refusal(kind: str, **changes: Any) -> list[dict[str, Any]]:
    with pytest.raises(InvalidInput) as caught:
        ingest.validate_batch(kind, [{**GOOD[kind], **changes}], now=NOW)
    assert caught.value.details is not None
    return list(caught.value.details)


def test_the_good_items_are_accepted() -> None:
    for kind, item in GOOD.items():
        assert len(ingest.validate_batch(kind, [item], now=NOW)) == 1, kind


def test_every_integer_is_refused_past_its_column_s_range_naming_the_field() -> None:
    checked = 0
    for kind in ingest.KINDS:
        for column_type, column_max in COLUMN_MAX.items():
            for name in _fields_of(kind, column_type):
                for value in (column_max + 1, 10**30):
                    assert [e["field"] for e in _refusal(kind, **{name: value})] == [name], (kind, name, value)
                checked += 1
    # queue_depth, rate_limit_remaining, sample_count, latency_sla_ms, input/output_tokens, latency_ms, duration_us
    assert checked == 8


def test_the_largest_integer_a_column_holds_is_accepted() -> None:
    for kind in ("llm-deployments", "llm-users", "llm-requests"):
        names = _fields_of(kind, Integer)
        rows = ingest.validate_batch(kind, [{**GOOD[kind], **dict.fromkeys(names, 2**31 - 1)}], now=NOW)
        assert all(rows[0][name] == 2**31 - 1 for name in names), kind


def test_every_float_must_be_finite_and_sane_naming_the_field() -> None:
    checked = 0
    for kind in ingest.KINDS:
        for name in _fields_of(kind, Float):
            for value in (math.inf, -math.inf, math.nan, 1e308):
                assert [e["field"] for e in _refusal(kind, **{name: value})] == [name], (kind, name, value)
            checked += 1
    # metric value, deploy duration_s, latency_p50/p95_ms, error_rate, cost_per_1k_tokens, daily_budget_usd,
    # cost_usd, quality_score
    assert checked == 9


def test_floats_within_their_bounds_are_accepted() -> None:
    deployment = {"latency_p50_ms": 120.5, "latency_p95_ms": float(ingest.MAX_MS), "cost_per_1k_tokens": 0.002,
                  "error_rate": 1.0}
    assert ingest.validate_batch("llm-deployments", [{**GOOD["llm-deployments"], **deployment}], now=NOW)
    assert ingest.validate_batch("llm-users", [{**GOOD["llm-users"], "daily_budget_usd": ingest.MAX_USD}], now=NOW)
    assert ingest.validate_batch("metrics", [{**GOOD["metrics"], "value": -ingest.MAX_METRIC}], now=NOW)


def test_json_fields_refuse_non_finite_numbers() -> None:
    # PostgreSQL's jsonb has no NaN or Infinity; found here, it is a 422 rather than a storage error.
    for kind, name in (("logs", "attrs"), ("spans", "tags"), ("llm-requests", "routing"), ("products", "info")):
        for value in (math.inf, math.nan):
            assert [e["field"] for e in _refusal(kind, **{name: {"a": [value]}})] == [name], (kind, name)


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_timestamp_outside_the_calendar_in_utc_is_refused_naming_the_field(moment: str) -> None:
    for kind, (_model, _table, _key, _clash, times) in ingest.KINDS.items():
        for name in times:
            errors = _refusal(kind, **{name: moment})
            assert [e["field"] for e in errors] == [name] and "out of range" in errors[0]["message"], (kind, name)


def test_time_range_errors_name_their_field() -> None:
    closed_early = _refusal("incidents", closed_at=isoformat(NOW - timedelta(hours=1)), opened_at=isoformat(NOW))
    assert closed_early == [{"index": 0, "field": "closed_at", "message": "closed_at is before opened_at"}]
    future = _refusal("spans", start=isoformat(NOW + timedelta(hours=1)))
    assert future[0]["field"] == "start" and "in the future" in future[0]["message"]
    old = _refusal("llm-requests", created_at=isoformat(datetime(2000, 1, 1, tzinfo=NOW.tzinfo)))
    assert old[0]["field"] == "created_at" and "older than" in old[0]["message"]
    late_close = _refusal("incidents", closed_at=isoformat(NOW + timedelta(days=1)))
    assert late_close[0]["field"] == "closed_at"
