"""The post-mortem job tests of tests/kortex/postmortems/test_jobs.py, on PostgreSQL: the skip-
locked dispatch, the insert that keeps one document per item (its answer read from RETURNING,
not rowcount) and every compare-and-set run on the real database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Harness, make_settings
from tests.kortex.postmortems.test_jobs import (  # noqa: F401 - collected here, on PostgreSQL
    test_a_job_writes_one_valid_cited_post_mortem_per_incident,
    test_another_tenant_sees_no_job_item_or_post_mortem,
    test_cancel_stops_queued_items_and_cancels_running_ones_when_asked,
    test_max_usd_stops_the_job_before_the_next_llm_call,
    test_running_twice_never_writes_two_and_a_rerun_skips_what_is_done,
    test_the_same_idempotency_key_answers_the_same_job,
    tenant,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def h(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """A container on the test database with the default tool policy (the post-mortem profile's tools)."""
    harness = Harness(make_settings(tmp_path_factory.mktemp("pg-postmortems"), pg_url))
    yield harness
    harness.close()
