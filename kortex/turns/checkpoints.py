"""Checkpoints: every step boundary of a session's turns, as a chain you can fork from or run a
turn again from.

A checkpoint is a point of the stored conversation, so nothing is written on the hot path to
have them: each turn has one where it starts (after its user message) and one after each step
that answered (after the model's message and its tool results). Each has a stable id (derived
from its turn and step), its parent (the boundary before it; a turn's start follows the end of
the turn before), the conversation position it stands for (by reference: ``turn_no, step,
ord``), and the conversation's size in tokens there (estimated, four characters a token).

- ``fork`` makes a new session whose history ends at a checkpoint; the original is untouched.
- ``retry`` runs a turn again from a checkpoint, as a new turn in such a fork: from the turn's
  start (the default) its question is asked again; from a later step of it, the model is asked to
  go on from there; either way with another model if one is named.
Everything is tenant-scoped: a checkpoint of another tenant's session does not exist here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection

from kortex.container import Kortex
from kortex.errors import Conflict, InvalidInput, NotFound
from kortex.storage import chats
from kortex.storage.records import MessageRecord, SessionRecord, TurnRecord
from kortex.turns import chat

_NAMESPACE = uuid.UUID("6b1f4c1e-2d1a-4e55-9a57-2f3c0b7d9e10")
MAX_MESSAGES = 5000  # a session longer than this is not forked (bounded work per request)
CONTINUE = ("[retry from a checkpoint] The investigation above stopped at this point. Go on from here and "
            "answer the original question: {question}")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    id: str
    parent_id: str | None
    turn_id: str
    turn_no: int
    step: int | None  # None: the turn's start (after its user message)
    position: tuple[int, int, int]  # the last message it includes: (turn_no, step, ord)
    tokens: int
    created_at: datetime


def checkpoint_id(turn_id: str, step: int | None) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{turn_id}:{'start' if step is None else step}"))


def chain(messages: list[MessageRecord]) -> list[Checkpoint]:
    """The session's checkpoints, root first, from its messages in conversation order."""
    out: list[Checkpoint] = []
    chars = 0
    for index, m in enumerate(messages):
        chars += len(m.content) + len(str(m.result or "")) + len(str(m.tool_calls or ""))
        following = messages[index + 1] if index + 1 < len(messages) else None
        # A boundary is after the user message, and after the last message of each step.
        if m.role == "user":
            step: int | None = None
        elif following is not None and following.turn_no == m.turn_no and following.step == m.step:
            continue  # the step's tool results are still to come
        else:
            step = m.step
        out.append(Checkpoint(id=checkpoint_id(m.turn_id, step), parent_id=out[-1].id if out else None,
                              turn_id=m.turn_id, turn_no=m.turn_no, step=step, position=(m.turn_no, m.step, m.ord),
                              tokens=chars // 4, created_at=m.created_at))
    return out


def _messages(k: Kortex, tenant_id: str, session_id: str) -> list[MessageRecord]:
    with k.db.connect() as conn:
        chats.get_session(conn, tenant_id, session_id)  # NotFound for another tenant's
        found = chats.list_messages(conn, tenant_id, session_id, limit=MAX_MESSAGES + 1)
    if len(found) > MAX_MESSAGES:
        raise InvalidInput(f"the session has more than {MAX_MESSAGES} messages; checkpoints are kept for shorter ones")
    return found


def of_turn(k: Kortex, tenant_id: str, turn_id: str) -> list[Checkpoint]:
    """The chain root-first up to the turn's last checkpoint (the session's earlier turns first)."""
    turn = chat.get_turn(k, tenant_id, turn_id)
    return [c for c in chain(_messages(k, tenant_id, turn.session_id)) if c.turn_no <= turn.turn_no]


def _find(k: Kortex, tenant_id: str, session_id: str, wanted: str) -> tuple[Checkpoint, list[Checkpoint]]:
    found = chain(_messages(k, tenant_id, session_id))
    for checkpoint in found:
        if checkpoint.id == wanted:
            return checkpoint, found
    raise NotFound("checkpoint not found in this session")


def fork(k: Kortex, tenant_id: str, session_id: str, checkpoint: str, name: str | None = None) -> SessionRecord:
    """A new session whose history is this one's up to ``checkpoint``; a new session like any
    other, so counted against ``sessions_per_minute``."""
    label = chat.session_name(name, "")  # "": the source's name, read with it
    point, _ = _find(k, tenant_id, session_id, checkpoint)
    with chat.counting_session(k, tenant_id), k.db.begin() as conn:
        return chats.get_session(conn, tenant_id, _fork_in(conn, tenant_id, session_id, point.position, label))


def _fork_in(conn: Connection, tenant_id: str, session_id: str, upto: tuple[int, int, int] | None,
             name: str) -> str:
    """Make the fork in the caller's transaction; returns its id."""
    source = chats.get_session(conn, tenant_id, session_id)
    label = name or f"{source.name} (fork)"[:chat.MAX_NAME]
    target = chats.create_session(conn, tenant_id, label, source.model)
    if upto is not None:
        chats.copy_conversation(conn, tenant_id, session_id, target.id, upto,
                                cut_error={"code": "forked", "message": "the fork ends inside this turn"})
    return target.id


@dataclass(frozen=True, slots=True)
class Retried:
    session: SessionRecord
    posted: chat.PostedTurn


def retry(k: Kortex, tenant_id: str, turn_id: str, *, checkpoint: str | None = None,
          model: str | None = None) -> Retried:
    """Run ``turn_id`` again as a new turn of a fork: from ``checkpoint`` (default: the turn's
    start), with ``model`` (default: the turn's). The fork and the turn are made together: a
    refused turn leaves no fork."""
    turn = chat.get_turn(k, tenant_id, turn_id)
    if not turn.finished:
        raise Conflict("the turn is still running; retry it once it has ended (or cancel it)", code="turn_in_progress")
    point, found = _find(k, tenant_id, turn.session_id, checkpoint or checkpoint_id(turn.id, None))
    if point.turn_no > turn.turn_no:
        raise InvalidInput("the checkpoint is after this turn; retry a later turn, or fork")
    question = _question(k, tenant_id, turn)
    upto: tuple[int, int, int] | None = point.position
    content = question  # an earlier turn's checkpoint: the question asked at that point of the conversation
    if point.turn_no == turn.turn_no and point.step is None:
        # From the turn's start: the conversation before it, and its question asked again.
        parent = next((c for c in found if c.id == point.parent_id), None)
        upto = parent.position if parent else None
    elif point.turn_no == turn.turn_no:
        content = CONTINUE.format(question=question)
    session, posted = chat.start_session(k, tenant_id, lambda conn: _fork_in(conn, tenant_id, turn.session_id, upto, ""),
                                         content, model=model or turn.model)
    return Retried(session=session, posted=posted)


def _question(k: Kortex, tenant_id: str, turn: TurnRecord) -> str:
    with k.db.connect() as conn:
        found = chats.list_messages(conn, tenant_id, turn.session_id, after=(turn.turn_no, -2, 0), limit=1)
    if not found or found[0].turn_no != turn.turn_no or found[0].role != "user":
        raise NotFound("the turn's question is gone")
    return found[0].content


__all__ = ["Checkpoint", "Retried", "chain", "checkpoint_id", "fork", "of_turn", "retry"]
