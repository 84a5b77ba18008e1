"""Totals past a cap on PostgreSQL: the figures a model quotes cover everything that matched,
with the same checks the SQLite tests run (its buckets, percentile ranks and span ends are
written differently there)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Harness, make_settings
from tests.kortex.tools.test_totals_beyond_cap import (  # noqa: F401 - collected here, on PostgreSQL
    test_active_incident_count_is_every_open_one,
    test_deployment_summary_counts_every_deployment,
    test_latency_buckets_are_those_of_their_requests,
    test_latency_trend_summary_covers_every_request,
    test_recent_requests_count_every_match_beside_the_page,
    test_request_volume_totals_cover_the_whole_window,
    test_trace_span_count_and_duration_cover_every_span,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def h(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    harness = Harness(make_settings(Path(tmp_path_factory.mktemp("pg-totals")), pg_url))
    yield harness
    harness.close()
