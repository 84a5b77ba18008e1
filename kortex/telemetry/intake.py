"""Telemetry ingest as the API asks for it: validate the batch whole, count it against the
tenant's ingest quotas, store it in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kortex.budget import Quota, take_together
from kortex.container import Kortex
from kortex.errors import NotFound
from kortex.telemetry import ingest
from kortex.timeparse import utcnow


def ingest_batch(k: Kortex, tenant_id: str, kind: str, items: Sequence[Any]) -> int:
    """Store ``items`` of ``kind`` for the tenant; the number accepted. A refused batch (unknown
    kind, bad items) counts against no quota."""
    if kind not in ingest.KINDS:
        raise NotFound(f"unknown ingest kind {kind!r}; use one of {', '.join(ingest.KINDS)}")
    rows = ingest.validate_batch(kind, items, now=utcnow())
    budget = k.settings.llm.budget
    prefix = k.settings.redis_prefix
    requests = Quota(k.redis, prefix, "ingest_requests", budget.ingest_requests_per_minute, "ingest requests")
    items_quota = Quota(k.redis, prefix, "ingest_items", budget.ingest_items_per_minute, "ingested items")
    # Both or neither: a batch refused for its items never holds a request's count meanwhile.
    window = take_together(tenant_id, (requests, 1), (items_quota, len(rows)))
    try:
        with k.db.begin() as conn:
            return ingest.write(conn, tenant_id, kind, rows)
    except BaseException:
        requests.give_back(tenant_id, window)
        items_quota.give_back(tenant_id, window, len(rows))
        raise
