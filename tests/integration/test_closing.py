"""A turn's ``done`` reaches clients only once the transaction that ended the turn has
committed, however it ends, so a client that read ``done`` and asks again at once is never
refused as if the turn still ran. If Redis refuses the ``done``, it is kept in the outbox and
published later. On PostgreSQL, where another connection does not see an uncommitted ending."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from kortex.errors import StreamError
from kortex.storage.schema import stream_outbox, turns
from kortex.testing.inline import drive
from kortex.testing.scratch import throwaway_prefix
from kortex.turns import chat, watchdog
from kortex.turns.cancel import cancel
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN, REDIS_URL
from tests.integration.redisproc import private_database


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    # A database of its own: the test sweeps with the watchdog, which reads every tenant's rows.
    with private_database(PG_ADMIN) as url, throwaway_prefix(REDIS_URL, "kxcl") as prefix:
        harness = Harness(make_settings(tmp_path, url, redis_url=REDIS_URL, redis_prefix=prefix))
        try:
            yield harness
        finally:
            harness.close()


def _status_when_done_is_sent(h: Harness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The turn's status as another connection reads it at the moment its ``done`` is appended."""
    seen: list[str] = []
    append = h.k.events.append

    def watching(turn_id: str, events: Any, **kw: Any) -> list[str]:
        if kw.get("final"):
            with h.k.db.connect() as conn:
                seen.append(conn.scalar(select(turns.c.status).where(turns.c.id == turn_id)))
        return append(turn_id, events, **kw)

    monkeypatch.setattr(h.k.events, "append", watching)
    return seen


def test_done_is_sent_after_the_turn_is_over_in_the_database(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _status_when_done_is_sent(h, monkeypatch)
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "s", "scripted:text_only")
    posted = chat.post_message(h.k, tenant, session.id, "hello")
    drive(h.k, posted.handoff)
    assert seen == ["done"]
    # what a client does on reading done: ask again at once, and be taken
    assert chat.post_message(h.k, tenant, session.id, "and then?").turn.status == "queued"


def test_a_cancel_sends_done_after_its_commit(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _status_when_done_is_sent(h, monkeypatch)
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "s", "scripted:text_only")
    posted = chat.post_message(h.k, tenant, session.id, "hello")
    cancel(h.k, tenant, posted.turn.id, by="key:abc")
    assert seen == ["cancelled"]


def test_a_done_redis_refuses_is_kept_and_published_by_the_watchdog(h: Harness,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    append = h.k.events.append

    def refusing(turn_id: str, events: Any, **kw: Any) -> list[str]:
        if kw.get("final"):
            raise StreamError("Redis is away")
        return append(turn_id, events, **kw)

    monkeypatch.setattr(h.k.events, "append", refusing)
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "s", "scripted:text_only")
    posted = chat.post_message(h.k, tenant, session.id, "hello")
    drive(h.k, posted.handoff)
    assert chat.get_turn(h.k, tenant, posted.turn.id).status == "done"
    assert "done" not in [e.type for e in h.events(posted.turn.id)]
    with h.k.db.connect() as conn:
        kept = conn.execute(select(stream_outbox.c.final).where(stream_outbox.c.turn_id == posted.turn.id)).all()
    assert [row.final for row in kept] == [True]
    monkeypatch.setattr(h.k.events, "append", append)  # Redis is back
    time.sleep(2.1)  # the outbox leaves rows younger than 2 s to a transaction that may be writing them
    assert watchdog.sweep(h.k).republished_events == 1
    events = h.events(posted.turn.id)
    assert events[-1].type == "done" and json.loads(events[-1].data)["status"] == "done"
    assert chat.get_turn(h.k, tenant, posted.turn.id).done_event_id == events[-1].id
