"""Totals past a cap on PostgreSQL: the figures a model quotes cover everything that matched,
with the same checks the SQLite tests run (its buckets, percentile ranks and span ends are
written differently there)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Harness, make_settings
from tests.kortex.tools.test_totals_beyond_cap import (
    check_active_incident_count_is_every_open_one,
    check_deployment_summary_counts_every_deployment,
    check_latency_buckets_are_those_of_their_requests,
    check_latency_trend_summary_covers_every_request,
    check_recent_requests_count_every_match_beside_the_page,
    check_request_volume_totals_cover_the_whole_window,
    check_trace_span_count_and_duration_cover_every_span,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    h = Harness(make_settings(Path(tmp_path_factory.mktemp("pg-totals")), pg_url))
    yield h
    h.close()


def test_request_volume_totals_cover_the_whole_window(pg: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    check_request_volume_totals_cover_the_whole_window(pg, monkeypatch)


def test_latency_trend_summary_covers_every_request(pg: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    check_latency_trend_summary_covers_every_request(pg, monkeypatch)


def test_latency_buckets_are_those_of_their_requests(pg: Harness) -> None:
    check_latency_buckets_are_those_of_their_requests(pg)


def test_deployment_summary_counts_every_deployment(pg: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    check_deployment_summary_counts_every_deployment(pg, monkeypatch)


def test_active_incident_count_is_every_open_one(pg: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    check_active_incident_count_is_every_open_one(pg, monkeypatch)


def test_trace_span_count_and_duration_cover_every_span(pg: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    check_trace_span_count_and_duration_cover_every_span(pg, monkeypatch)


def test_recent_requests_count_every_match_beside_the_page(pg: Harness) -> None:
    check_recent_requests_count_every_match_beside_the_page(pg)
