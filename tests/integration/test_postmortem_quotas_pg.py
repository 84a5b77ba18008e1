"""The post-mortem limits on PostgreSQL and Redis: the API tests of
tests/api/test_postmortem_quotas.py and test_postmortem_documents.py run here on the real
services, the race for a tenant's last open places among them (PostgreSQL's row lock on the
tenant, where SQLite has its one writer)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.test_postmortem_documents import (  # noqa: F401 - collected here, on PostgreSQL
    done,
    test_a_page_has_a_default_size_and_a_most,
    test_documents_are_read_page_by_page_in_incident_order,
)
from tests.api.test_postmortem_quotas import (  # noqa: F401 - collected here, on PostgreSQL
    test_a_job_larger_than_the_cap_itself_is_refused_as_such,
    test_a_job_that_would_pass_the_tenants_open_items_is_refused_whole,
    test_forced_jobs_never_queue_more_than_the_default_cap,
    test_new_jobs_a_minute_are_limited_and_only_jobs_made_count,
    test_two_jobs_racing_for_the_last_open_places_do_not_both_get_in,
)
from tests.conftest import Harness, make_settings
from tests.integration.conftest import REDIS_URL

pytestmark = pytest.mark.integration


@pytest.fixture
def harness_factory(pg_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def factory(**overrides: Any) -> Harness:
        h = Harness(make_settings(tmp_path, pg_url, redis_url=REDIS_URL, redis_prefix=redis_prefix, **overrides))
        made.append(h)
        return h

    yield factory
    for h in made:
        h.close()


@pytest.fixture
def harness(harness_factory: Callable[..., Harness]) -> Harness:
    return harness_factory()
