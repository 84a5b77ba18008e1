"""The embedded store's SQL on PostgreSQL, in a database whose collation is not C (what
docker-compose's postgres image gives: en_US.utf8; here ICU's root locale when the server has
it): trace pages, log cursors and matchers, any-case text, product listing and metric buckets,
with the same checks the SQLite tests run, and metric buckets identical to SQLite's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from kortex.storage.migrate import upgrade
from kortex.telemetry import scenarios
from kortex.testing.scratch import throwaway_database
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN
from tests.kortex.tools.test_get_logs import (
    check_a_missing_label_equals_the_empty_string,
    check_cursor_keeps_the_window_to_the_microsecond,
    check_plain_text_matches_in_any_case_and_script,
)
from tests.kortex.tools.test_list_products import (
    check_one_product_is_found_however_many_are_newer,
    check_the_newest_are_listed_first_past_the_per_table_cut,
)
from tests.kortex.tools.test_metric_series import check_buckets_start_at_the_window_start_to_the_microsecond
from tests.kortex.tools.test_trace_pages import check_mixed_case_span_ids_page_exactly_once

pytestmark = pytest.mark.integration


def _collation(admin: psycopg.Connection) -> str | None:
    """CREATE DATABASE options for a collation other than C, if this server has one."""
    ctype = admin.execute("SELECT datctype FROM pg_database WHERE datname = current_database()").fetchone()
    names = {r[0] for r in admin.execute("SELECT collname FROM pg_collation").fetchall()}
    if "und-x-icu" in names and ctype:
        return f"TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'und' LOCALE '{ctype[0]}'"
    for name in ("en_US.utf8", "en_US.UTF-8"):
        if name in names:
            return f"TEMPLATE template0 LOCALE '{name}'"
    return None


@pytest.fixture(scope="module")
def collated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """A throwaway database that sorts 'a000' before 'B000', as C would not."""
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        options = _collation(admin)
    if options is None:
        pytest.skip("this PostgreSQL has no collation other than C (no ICU, no en_US locale)")
    with throwaway_database(PG_ADMIN, options=options) as (url, _name):
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 'a000' < 'B000'").fetchone() == (True,)
        upgrade(url)
        h = Harness(make_settings(tmp_path_factory.mktemp("collated"), url))
        try:
            yield h
        finally:
            h.close()


def test_mixed_case_span_ids_page_exactly_once(collated: Harness) -> None:
    check_mixed_case_span_ids_page_exactly_once(collated)


def test_log_cursor_matchers_and_any_case_text(collated: Harness) -> None:
    check_cursor_keeps_the_window_to_the_microsecond(collated)
    check_a_missing_label_equals_the_empty_string(collated)
    check_plain_text_matches_in_any_case_and_script(collated)


def test_list_products_newest_first_and_one_by_name(collated: Harness) -> None:
    check_one_product_is_found_however_many_are_newer(collated)
    check_the_newest_are_listed_first_past_the_per_table_cut(collated)


def test_metric_buckets_are_the_same_as_on_sqlite(collated: Harness, harness: Harness) -> None:
    assert check_buckets_start_at_the_window_start_to_the_microsecond(collated) == \
        check_buckets_start_at_the_window_start_to_the_microsecond(harness)
    now = datetime(2026, 11, 27, 12, 0, 0, 123456, tzinfo=UTC)  # a start that is not a whole millisecond
    answers = []
    for h in (collated, harness):
        tenant = h.tenant("seeded")
        with h.k.db.begin() as conn:
            scenarios.seed(conn, tenant, scenarios.get_scenario("checkout-deploy-regression"), now=now)
        args = {"product": "checkout", "metric_name": "http_request_duration_seconds_p99"}
        answers.append([h.call(tenant, tool, {**args, **extra}, now=now).content["samples"]
                        for tool, extra in (("get_metrics", {"time_range": "last 6h", "step": "5m"}),
                                            ("get_metrics", {"time_range": "last 3h"}),
                                            ("compare_to_baseline", {"time_range": "last 1h"}))])
    assert all(answers[0]) and answers[0] == answers[1]
