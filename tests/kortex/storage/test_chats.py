"""Deleting a session while a message is posted to it: one of the two wins, never both. The
post that was answered with a turn keeps it (the delete is a 409), or the delete wins and the
post finds no session (404); a turn the post was answered for is never deleted under it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import event

from kortex.errors import Conflict, NotFound
from kortex.turns import chat
from tests.conftest import Harness


def race_post_into_delete(h: Harness, tenant: str, session_id: str) -> tuple[Any, Any, list[str]]:
    """Delete the session, and right after the delete has read the session's turns (the moment
    the race was lost in), post a message to it from another thread, giving the post a second
    to finish before the delete goes on. Returns (the delete's result or error, the post's,
    the statements the delete ran)."""
    deleter = threading.get_ident()
    statements: list[str] = []
    posted: dict[str, Any] = {}
    thread: threading.Thread | None = None

    def post() -> None:
        try:
            posted["result"] = chat.post_message(h.k, tenant, session_id, "hello?")
        except Exception as exc:  # NotFound when the delete won
            posted["result"] = exc

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal thread
        if threading.get_ident() != deleter:
            return
        statements.append(statement)
        reads_turns = statement.lstrip().upper().startswith("SELECT") and "FROM turns" in statement
        if thread is None and reads_turns:
            thread = threading.Thread(target=post)
            thread.start()
            thread.join(1.0)  # a post that is not held up by the delete has committed by now

    event.listen(h.k.db.engine, "after_cursor_execute", after)
    try:
        try:
            deleted: Any = chat.delete_session(h.k, tenant, session_id, by="test")
        except (Conflict, NotFound) as exc:
            deleted = exc
    finally:
        event.remove(h.k.db.engine, "after_cursor_execute", after)
    assert thread is not None, statements
    thread.join(30)
    return deleted, posted["result"], [s for s in statements if not s.lstrip().upper().startswith("INSERT INTO DEC")]


def check_one_winner(h: Harness, tenant: str, deleted: Any, posted: Any) -> None:
    if isinstance(deleted, Conflict):  # the post came first: its turn is there
        assert chat.get_turn(h.k, tenant, posted.turn.id).status == "queued"
    else:  # the delete came first: the post was told the session is gone, no turn was promised
        assert deleted == 0, deleted
        assert isinstance(posted, NotFound), posted


def test_a_post_racing_the_delete_of_its_session_on_sqlite_keeps_its_turn_or_is_refused(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    session = chat.create_session(harness.k, tenant, "race")
    deleted, posted, _ = race_post_into_delete(harness, tenant, session.id)
    check_one_winner(harness, tenant, deleted, posted)


def test_deleting_a_session_with_a_turn_running_is_a_conflict_and_without_one_removes_it(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    session = chat.create_session(harness.k, tenant, "s")
    posted = chat.post_message(harness.k, tenant, session.id, "hello?")
    with pytest.raises(Conflict) as busy:
        chat.delete_session(harness.k, tenant, session.id, by="test")
    assert busy.value.details == {"turn_id": posted.turn.id}
    assert chat.get_turn(harness.k, tenant, posted.turn.id).status == "queued"  # the refused delete changed nothing
    with pytest.raises(NotFound):
        chat.delete_session(harness.k, tenant, "01a21d8b-0000-7000-8000-000000000000", by="test")
    with pytest.raises(NotFound):
        chat.delete_session(harness.k, harness.tenant("other"), session.id, by="test")  # another tenant's
