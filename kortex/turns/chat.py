"""The chat operations the API and the CLI share: sessions, posting a message, reading a turn."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.engine import Connection

from kortex import budget
from kortex.container import Kortex
from kortex.errors import Conflict, InvalidInput, ProviderError, RateLimited, StreamError
from kortex.llm.registry import ProviderRegistry
from kortex.messages import Usage
from kortex.storage import audit, chats, posting, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.posting import NewTurn
from kortex.storage.records import MessageRecord as MessageRecord  # the records this door hands out
from kortex.storage.records import SessionRecord as SessionRecord
from kortex.storage.records import TurnRecord as TurnRecord
from kortex.storage.turns import ONE_STATEMENT_WRITE
from kortex.text import check_name, check_storable
from kortex.turns.admission import Admitted, past_busy_mark
from kortex.turns.handoff import NOTHING, Handoff, StepDispatch
from kortex.turns.routed import AUTO, Router

log = logging.getLogger(__name__)

MAX_NAME = 200
MAX_IDEMPOTENCY_KEY = 200


@dataclass(frozen=True, slots=True)
class PostedTurn:
    turn: TurnRecord
    created: bool
    handoff: Handoff


def check_model(k: Kortex, model: str | None, field: str = "model") -> str | None:
    """``model`` stripped, once it names a model that can take a turn now (or ``auto`` with a
    model to route to); every refusal is a 4xx whose details name ``field``."""
    return usable_model(k.providers, k.router, model, field)


def usable_model(providers: ProviderRegistry, router: Router, model: str | None, field: str = "model") -> str | None:
    """``check_model`` on a registry and router of one's own (the CLI checks before its stack
    starts)."""
    if model is None:
        return None
    check_storable(model, field)
    model = model.strip()
    if not model or len(model) > 200:
        raise InvalidInput(f"{field} must be 1-200 characters, e.g. 'offline:analyst'",
                           details=[{"field": field, "message": "must be 1-200 characters"}])
    try:
        if model == AUTO:  # each step's model is chosen by the router (kortex/turns/routed.py), so
            router.check_routable(providers)  # refused now, as a pinned one is, if it has none to choose
        else:
            providers.resolve(model)
    except (InvalidInput, ProviderError) as exc:  # as resolve_model names the field
        if exc.details is None:
            exc.details = [{"field": field, "message": exc.message}]
        raise
    return model


def resolve_model(k: Kortex, model: str, field: str = "model") -> None:
    """Refuse a model that cannot take a call now (unknown or unavailable), as a 4xx naming
    ``field``: the registry knows models, not requests, so the field is named here, its code kept
    (ProviderError takes no details when raised, hence set on the way through)."""
    try:
        k.providers.resolve(model)
    except (InvalidInput, ProviderError) as exc:
        if exc.details is None:
            exc.details = [{"field": field, "message": exc.message}]
        raise


def session_name(name: str | None, default: str) -> str:
    """The name a caller gave a new session, stripped, or ``default`` when it gave none."""
    check_name(name, "name")
    name = (name or "").strip()
    if len(name) > MAX_NAME:
        raise InvalidInput(f"name is longer than {MAX_NAME} characters",
                           details=[{"field": "name", "message": f"longer than {MAX_NAME} characters"}])
    return name or default


@contextmanager
def counting_session(k: Kortex, tenant_id: str) -> Iterator[None]:
    """Count a new session against the tenant's ``sessions_per_minute`` (RateLimited past it),
    and give the count back if the block fails: a session not made costs no quota. Enter it
    after validation, so a refused request costs none either. Every way to make a session
    (create, fork, retry) counts here."""
    settings = k.settings.llm.budget
    with budget.Quota(k.redis, k.settings.redis_prefix, "sessions", settings.sessions_per_minute,
                      "new sessions").counting(tenant_id):
        yield


@dataclass(frozen=True, slots=True)
class NewSession:
    session: SessionRecord
    created: bool  # False when an Idempotency-Key matched an earlier request


def create_session(k: Kortex, tenant_id: str, name: str | None, model: str | None = None) -> SessionRecord:
    return new_session(k, tenant_id, name, model).session


def new_session(k: Kortex, tenant_id: str, name: str | None, model: str | None = None, *,
                idempotency_key: str | None = None) -> NewSession:
    """A new session. With ``idempotency_key``, the same request again (its name and model as
    stored: stripped, defaulted) answers the session the key made, ``created`` False, and costs
    no quota; another request with the key is a Conflict (``idempotency_mismatch``). The key is
    the session's: once the session is deleted, the key makes a new one."""
    name = session_name(name, "untitled")
    check_idempotency_key(idempotency_key)
    model = check_model(k, model)
    if idempotency_key is None:
        return NewSession(_store_session(k, tenant_id, name, model, None, None), created=True)
    digest = posting.request_hash(name, model)
    earlier = _session_by_key(k, tenant_id, idempotency_key, digest)
    if earlier is not None:  # read before the quota: a replay makes nothing, so counts for nothing
        return earlier
    try:
        return NewSession(_store_session(k, tenant_id, name, model, idempotency_key, digest), created=True)
    except (Conflict, RateLimited) as exc:
        if isinstance(exc, Conflict) and exc.code != "integrity":
            raise
        # Two identical requests raced on the key: the loser's insert failed on the unique index
        # (its count given back), or the winner's count filled the quota. It answers the winner's.
        earlier = _session_by_key(k, tenant_id, idempotency_key, digest)
        if earlier is None:
            raise
        return earlier


def _store_session(k: Kortex, tenant_id: str, name: str, model: str | None, idempotency_key: str | None,
                   digest: str | None) -> SessionRecord:
    with counting_session(k, tenant_id), k.db.begin() as conn:
        return chats.create_session(conn, tenant_id, name, model, idempotency_key=idempotency_key,
                                    request_hash=digest)


def _session_by_key(k: Kortex, tenant_id: str, idempotency_key: str, digest: str) -> NewSession | None:
    """The session this Idempotency-Key made, if any; the key used for another request is a Conflict."""
    with k.db.connect() as conn:
        made = posting.replayed(chats.session_by_key(conn, tenant_id, idempotency_key), digest)
    return None if made is None else NewSession(made, created=False)


def check_idempotency_key(idempotency_key: str | None) -> None:
    """An Idempotency-Key the database can store and index: 1-200 characters, no NUL; every
    refusal a 422 naming the header."""
    check_storable(idempotency_key, "Idempotency-Key")
    if idempotency_key is not None and not (0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY):
        raise InvalidInput(f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} characters", code="validation",
                           details=[{"field": "Idempotency-Key", "message": f"must be 1-{MAX_IDEMPOTENCY_KEY} characters"}])


def get_session(k: Kortex, tenant_id: str, session_id: str) -> tuple[SessionRecord, Usage]:
    """A session and what its turns have used."""
    with k.db.connect() as conn:
        session = chats.get_session(conn, tenant_id, session_id)
        return session, turns.session_usage(conn, tenant_id, session.id)


def list_messages(k: Kortex, tenant_id: str, session_id: str, *, after: tuple[int, int, int] | None,
                  limit: int) -> list[MessageRecord]:
    """A page of a session's messages in conversation order (NotFound for another tenant's)."""
    with k.db.connect() as conn:
        chats.get_session(conn, tenant_id, session_id)
        return chats.list_messages(conn, tenant_id, session_id, after=after, limit=limit)


@dataclass(frozen=True, slots=True)
class SessionPage:
    sessions: list[SessionRecord]
    next_before: str | None  # pass as ``before`` for the next (older) page; None at the end


def list_sessions(k: Kortex, tenant_id: str, *, before: str | None = None, limit: int = 50) -> SessionPage:
    """The tenant's sessions, newest first, a page at a time (keyset: stable while sessions are
    created, unlike an offset)."""
    position = _session_cursor(k, tenant_id, before)
    with k.db.connect() as conn:
        rows = chats.list_sessions(conn, tenant_id, before=position, limit=limit)
    last = rows[-1] if len(rows) == limit else None
    token = None
    if last is not None:
        token = k.cursors.encode({"at": last.created_at.isoformat(), "id": last.id},
                                 _session_pages(tenant_id))
    return SessionPage(sessions=rows, next_before=token)


def _session_pages(tenant_id: str) -> dict[str, str]:
    return {"pages": "sessions", "tenant": tenant_id}


def _session_cursor(k: Kortex, tenant_id: str, token: str | None) -> tuple[datetime, str] | None:
    # Signed (and bound to the tenant), so only a page's own next_before is taken: a made-up
    # position (any date, an id that is no uuid) is the caller's mistake, refused here rather
    # than sent to the database, where it could only fail as an outage or page nothing.
    if token is None:
        return None
    try:
        position = k.cursors.decode(token, _session_pages(tenant_id))
        when = datetime.fromisoformat(position["at"])
        if when.tzinfo is None:
            raise ValueError("naive")
        return when, str(uuid.UUID(position["id"]))
    except (InvalidInput, ValueError, KeyError, TypeError):
        raise InvalidInput("before must be a next_before value from an earlier page", code="validation",
                           details=[{"field": "before", "message": "not a page cursor"}]) from None


def delete_session(k: Kortex, tenant_id: str, session_id: str, *, by: str) -> int:
    """Delete a session, its turns, messages and events; its audit rows stay (with a row saying
    who deleted it). A session with a running turn is refused (cancel the turn first). Returns
    how many turns went."""
    with k.db.begin() as conn:
        turn_ids = chats.delete_session(conn, tenant_id, session_id)
        audit.write_entries(conn, [AuditEntry(tenant_id=tenant_id, kind="session_deleted", subject="session",
                                              ok=True, payload={"by": by, "turns": len(turn_ids)},
                                              session_id=session_id)])
    for turn_id in turn_ids:  # after the commit; a stream left behind expires with its TTL anyway
        try:
            k.events.delete(turn_id)
        except StreamError:  # Redis is down: the events expire on their own
            log.warning("could not delete the events of turn %s; they expire with their stream", turn_id,
                        exc_info=True)
    return len(turn_ids)


def post_message(
    k: Kortex,
    tenant_id: str,
    session_id: str,
    content: str,
    *,
    model: str | None = None,
    idempotency_key: str | None = None,
) -> PostedTurn:
    """Store the user message and a queued turn; the caller enqueues ``handoff`` afterwards."""
    model = _check_post(k, content, model, idempotency_key)
    admission = _Admission(k, tenant_id)
    # Where the turn is written in one statement (PostgreSQL), that statement is the whole
    # change: autocommit spares the BEGIN and COMMIT round trips of a transaction that would
    # hold nothing else (the admission read before it changes nothing).
    one_statement = k.db.dialect in ONE_STATEMENT_WRITE
    try:
        for attempt in range(2):
            try:
                with k.db.connect() if one_statement else k.db.begin() as conn:
                    new = admission.create_turn(conn, session_id, content, model, idempotency_key)
                break
            except Conflict as exc:
                # Two identical requests raced on the Idempotency-Key: the loser reads the winner's turn.
                if exc.code != "integrity" or idempotency_key is None or attempt:
                    raise
                admission.give_back()  # the loser created nothing: give its count and slot back before it replays
    except BaseException:
        admission.give_back()  # counted, then the transaction failed: no turn was created
        raise
    return admission.posted(new)


def start_session(k: Kortex, tenant_id: str, make: Callable[[Connection], str], content: str, *,
                  model: str | None = None) -> tuple[SessionRecord, PostedTurn]:
    """A new session, made by ``make`` (which returns its id), with ``content`` posted to it, in
    one transaction: whatever refuses the post (the model, the content, a budget or a rate)
    leaves no session behind. Counted against ``sessions_per_minute`` like any new session."""
    model = _check_post(k, content, model, None)
    admission = _Admission(k, tenant_id)
    with counting_session(k, tenant_id):
        try:
            with k.db.begin() as conn:
                session_id = make(conn)
                new = admission.create_turn(conn, session_id, content, model, None)
                session = chats.get_session(conn, tenant_id, session_id)
        except BaseException:
            admission.give_back()
            raise
    return session, admission.posted(new)


def _check_post(k: Kortex, content: str, model: str | None, idempotency_key: str | None) -> str | None:
    """Everything about a post that needs no lookup but the model's; returns the model."""
    if not content or not content.strip():
        raise InvalidInput("content must not be empty", code="validation",
                           details=[{"field": "content", "message": "empty"}])
    check_storable(content, "content")
    limit = k.settings.turn.max_message_chars
    if len(content) > limit:
        raise InvalidInput(f"content is longer than {limit} characters", code="validation",
                           details=[{"field": "content", "message": f"longer than {limit} characters"}])
    check_idempotency_key(idempotency_key)
    return check_model(k, model)


class _Admission:
    """A new turn's budget checks and its slot and count in Redis, and giving those back when
    the turn is not created after all."""

    def __init__(self, k: Kortex, tenant_id: str) -> None:
        self.k, self.tenant_id = k, tenant_id
        self.taken: list[tuple[str, Admitted]] = []  # the new turn's slot and count, once admitted

    def create_turn(self, conn: Connection, session_id: str, content: str, model: str | None,
                    idempotency_key: str | None) -> NewTurn:
        return posting.create_turn(
            conn, tenant_id=self.tenant_id, session_id=session_id, content=content, model=model,
            deadline=timedelta(seconds=self.k.settings.turn.deadline), idempotency_key=idempotency_key,
            admit=self._admit,
        )

    def _admit(self, conn: Connection, state: posting.Admission) -> None:
        budget_settings = self.k.settings.llm.budget
        spent = state.spent
        budget.check_spend(budget_settings, spent)
        # The slot and this minute's count in one atomic step, taken last, once every other check
        # has passed: a refused request costs no rate (kortex/turns/admission.py).
        per_minute = budget.Limits.of(budget_settings, spent.tenant_settings).turns_per_minute
        self.taken.append((state.turn_id, self.k.slots.take(self.tenant_id, state.turn_id,
                                                            budget_settings.max_concurrent_turns_per_tenant,
                                                            per_minute)))

    def give_back(self) -> None:
        while self.taken:
            turn_id, admitted = self.taken.pop()
            if admitted.window is not None:
                self.k.slots.refund(self.tenant_id, admitted.window)
            self.k.slots.give_back(self.tenant_id, turn_id)

    def posted(self, new: NewTurn) -> PostedTurn:
        turn = new.turn
        queued_step0 = turn.status == "queued" and turn.step == 0
        # A retried request re-enqueues a turn nobody picked up yet: harmless (the step claim is a
        # compare-and-set) and it heals a first attempt whose enqueue failed.
        busy = bool(self.taken) and past_busy_mark(self.taken[-1][1].live, self.k.settings.turn.busy_tenant_turns)
        handoff = Handoff(steps=(StepDispatch(self.tenant_id, turn.id, 0, busy=busy),)) if queued_step0 else NOTHING
        return PostedTurn(turn=turn, created=new.created, handoff=handoff)


def get_turn(k: Kortex, tenant_id: str, turn_id: str) -> TurnRecord:
    with k.db.connect() as conn:
        return turns.get_turn(conn, tenant_id, turn_id)


def turn_with_models(k: Kortex, tenant_id: str, turn_id: str) -> tuple[TurnRecord, list[tuple[int, str, bool]]]:
    """A turn and the model that answered each of its steps, and whether the router chose it."""
    with k.db.connect() as conn:
        turn = turns.get_turn(conn, tenant_id, turn_id)
        return turn, audit.models_by_step(conn, tenant_id, turn_id)
