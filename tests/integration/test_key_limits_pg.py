"""The cap on a tenant's active API keys on PostgreSQL and Redis: the tests of
tests/api/test_key_limits.py run here on the real services, the race for the last place among
them (PostgreSQL's row lock on the tenant, where SQLite has its one writer)."""

from __future__ import annotations

import pytest

from tests.api.test_key_limits import (  # noqa: F401 - collected here, on PostgreSQL
    test_a_tenant_holds_at_most_its_cap_of_active_keys,
    test_the_default_cap_is_a_hundred_active_keys,
    test_the_key_list_is_read_page_by_page_oldest_first,
    test_two_creates_racing_for_the_last_place_do_not_both_get_it,
)
from tests.integration.test_postmortem_quotas_pg import harness, harness_factory  # noqa: F401 - PostgreSQL ones

pytestmark = pytest.mark.integration
