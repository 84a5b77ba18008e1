"""The chat operations the API and the CLI share: sessions, posting a message, reading a turn."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.engine import Connection

from kortex import budget
from kortex.container import Kortex
from kortex.errors import Conflict, InvalidInput
from kortex.storage import chats, turns
from kortex.storage.records import SessionRecord, TurnRecord
from kortex.turns.handoff import NOTHING, Handoff, StepDispatch

MAX_NAME = 200
MAX_IDEMPOTENCY_KEY = 200


@dataclass(frozen=True, slots=True)
class PostedTurn:
    turn: TurnRecord
    created: bool
    handoff: Handoff


def _no_nul(value: str | None, field: str) -> None:
    # PostgreSQL text and jsonb cannot hold NUL; caught here it is the caller's mistake (422),
    # caught by the driver it would look like an outage (503).
    if value is not None and "\x00" in value:
        raise InvalidInput(f"{field} must not contain NUL (\\u0000) characters", code="validation",
                           details=[{"field": field, "message": "contains a NUL character"}])


def _check_model(k: Kortex, model: str | None) -> str | None:
    if model is None:
        return None
    _no_nul(model, "model")
    model = model.strip()
    if not model or len(model) > 200:
        raise InvalidInput("model must be 1-200 characters, e.g. 'offline:analyst'")
    k.providers.resolve(model)  # unknown or unavailable models fail here, as a 4xx
    return model


def create_session(k: Kortex, tenant_id: str, name: str | None, model: str | None = None) -> SessionRecord:
    _no_nul(name, "name")
    name = (name or "").strip() or "untitled"
    if len(name) > MAX_NAME:
        raise InvalidInput(f"name is longer than {MAX_NAME} characters")
    model = _check_model(k, model)
    budget_settings = k.settings.llm.budget
    quota = budget.Quota(k.redis, k.settings.redis_prefix, "sessions", budget_settings.sessions_per_minute,
                         "new sessions")
    window = quota.take(tenant_id)  # after validation: a refused request costs no quota
    try:
        with k.db.begin() as conn:
            return chats.create_session(conn, tenant_id, name, model)
    except BaseException:
        quota.give_back(tenant_id, window)
        raise


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
    if not content or not content.strip():
        raise InvalidInput("content must not be empty")
    _no_nul(content, "content")
    _no_nul(idempotency_key, "Idempotency-Key")
    limit = k.settings.turn.max_message_chars
    if len(content) > limit:
        raise InvalidInput(f"content is longer than {limit} characters")
    if idempotency_key is not None and not (0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY):
        raise InvalidInput(f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} characters")
    model = _check_model(k, model)
    budget_settings = k.settings.llm.budget
    cap = budget_settings.max_concurrent_turns_per_tenant

    counted: list[bool] = []

    def admit(conn: Connection, state: turns.Admission) -> None:
        spent = budget.Spend(usd_today=state.usd_today, session_tokens=state.session_tokens,
                             tenant_settings=state.tenant_settings)
        budget.check_spend(budget_settings, spent)
        # Counted last, once every other check has passed: a refused request costs no rate.
        budget.check_rate(k.redis, k.settings.redis_prefix, budget_settings, tenant_id, spent.tenant_settings)
        counted.append(True)

    try:
        for attempt in range(2):
            try:
                with k.db.begin() as conn:
                    new = turns.create_turn(
                        conn, tenant_id=tenant_id, session_id=session_id, content=content, model=model,
                        deadline=timedelta(seconds=k.settings.turn.deadline),
                        idempotency_key=idempotency_key, max_active_per_tenant=cap, admit=admit,
                    )
                break
            except Conflict as exc:
                # Two identical requests raced on the Idempotency-Key: the loser reads the winner's turn.
                if exc.code != "integrity" or idempotency_key is None or attempt:
                    raise
                if counted:  # the loser created nothing: give its count back before it replays
                    counted.clear()
                    budget.refund_rate(k.redis, k.settings.redis_prefix, tenant_id)
    except BaseException:
        if counted:  # counted, then the transaction failed: no turn was created
            budget.refund_rate(k.redis, k.settings.redis_prefix, tenant_id)
        raise
    turn = new.turn
    queued_step0 = turn.status == "queued" and turn.step == 0
    # A retried request re-enqueues a turn nobody picked up yet: harmless (the step claim is a
    # compare-and-set) and it heals a first attempt whose enqueue failed.
    handoff = Handoff(steps=(StepDispatch(tenant_id, turn.id, 0),)) if queued_step0 else NOTHING
    return PostedTurn(turn=turn, created=new.created, handoff=handoff)


def get_turn(k: Kortex, tenant_id: str, turn_id: str) -> TurnRecord:
    with k.db.connect() as conn:
        return turns.get_turn(conn, tenant_id, turn_id)
