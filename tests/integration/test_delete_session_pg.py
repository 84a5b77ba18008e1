"""Deleting a session on PostgreSQL: a post racing the delete keeps its turn or is refused, never
both answered and deleted (tests/kortex/storage/test_chats.py has the race on SQLite), in as
few statements as before the SQLite fix."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kortex.testing.scratch import throwaway_prefix
from kortex.turns import chat
from tests.conftest import Harness, make_settings
from tests.integration.conftest import REDIS_URL
from tests.kortex.storage.test_chats import check_one_winner, race_post_into_delete

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def h(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with throwaway_prefix(REDIS_URL) as prefix:
        harness = Harness(make_settings(tmp_path_factory.mktemp("delete-pg"), pg_url, redis_url=REDIS_URL,
                                        redis_prefix=prefix))
        yield harness
        harness.close()


def test_a_post_racing_the_delete_of_its_session_keeps_its_turn_or_is_refused_on_postgresql(h: Harness) -> None:
    tenant = h.tenant("race-pg")
    session = chat.create_session(h.k, tenant, "race")
    deleted, posted, _ = race_post_into_delete(h, tenant, session.id)
    check_one_winner(h, tenant, deleted, posted)


def test_deleting_a_session_with_a_finished_turn_takes_four_statements_on_postgresql(h: Harness) -> None:
    tenant = h.tenant("count-pg")
    h.seed(tenant)
    session = chat.create_session(h.k, tenant, "done")
    turn = h.ask(tenant, "why?", session_id=session.id)
    assert turn.status == "done"
    second = chat.create_session(h.k, tenant, "racing")
    # The race helper records the delete's statements; the post it starts is refused or wins.
    deleted, posted, statements = race_post_into_delete(h, tenant, session.id)
    assert deleted == 1 and posted.__class__.__name__ == "NotFound"
    # the lock (a write to the session row), the turns, the kept events, the session (the audit row aside)
    assert len(statements) == 4, statements
    assert chat.delete_session(h.k, tenant, second.id, by="test") == 0
