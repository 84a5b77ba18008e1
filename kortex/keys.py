"""API keys and tenants as an administrator manages them: issue a key with a role, list them
(never a secret), revoke one, disable or enable a tenant.

A revocation must stop a key at once, but API processes keep verified keys for a few seconds
(api/deps.py AuthCache) so that a busy client does not cost a database lookup per request. Each
change here bumps a counter in Redis; every API process reads ``revocation_epoch`` about once a
second and forgets the keys it verified when it moves. The embedded mode has no Redis shared
between processes (each has its own in-process store, so `kortex admin revoke-key` could not
reach `kortex api`'s): there the epoch is read from the database the two share instead.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Hashable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.engine import Connection, Row

from kortex.access import DEFAULT_ROLE, ROLES, Permission, valid_role
from kortex.container import Kortex
from kortex.errors import Conflict, InvalidInput, NotFound
from kortex.storage import audit, tenants
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TenantRecord
from kortex.storage.schema import api_keys
from kortex.storage.schema import tenants as tenants_table
from kortex.storage.tenants import Caller
from kortex.text import check_name
from kortex.timeparse import utcnow

log = logging.getLogger(__name__)

MAX_KEY_NAME = 200
#: a key's public id, as ``kortex.ids`` makes them
KEY_ID = re.compile(r"^[0-9a-f]{12}\Z")
#: roles that may manage keys: a tenant keeps at least one active key with one of them
MANAGERS = frozenset(role for role, perms in ROLES.items() if Permission.KEYS in perms)
#: the embedded revocation epoch names the keys revoked this recently; the retention policy
#: keeps a revoked key at least this long (config_retention.py: revoked_keys_days >= 1)
RECENT_REVOCATIONS = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    key_id: str
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None


def epoch_key(prefix: str) -> str:
    return f"{prefix}:auth:epoch"


def revocation_epoch(k: Kortex) -> Hashable:
    """A value that moves whenever a key or tenant stops being valid: Redis' counter, or in the
    embedded mode the revoked keys and disabled tenants themselves (a few rows there).

    The retention policy deletes revoked keys' rows (kortex/storage/retention.py), so the count
    of revoked keys also goes down, and a run that deletes as many as are revoked meanwhile
    leaves it where it was; the latest revocation time moves with a new one only if its
    transaction, which stamps the time before it commits, commits last. So the epoch also names
    the keys revoked in the last day: a new revocation adds an id never named before, for a day
    (the API reads the epoch every second), and retention never deletes a key revoked that
    recently (``RECENT_REVOCATIONS``). A deletion moves the epoch too, which only makes the API
    processes verify their keys once more.
    Redis' counter is only ever incremented: retention does not touch it."""
    if not k.settings.embedded:
        value: Any = k.redis.get(epoch_key(k.settings.redis_prefix))
        return int(value or 0)
    c = api_keys.c
    with k.db.connect() as conn:
        revoked = conn.execute(select(func.count(), func.max(c.revoked_at)).where(c.revoked_at.is_not(None))).one()
        recent = conn.execute(select(c.key_id).where(c.revoked_at >= utcnow() - RECENT_REVOCATIONS)).scalars()
        disabled = conn.execute(select(tenants_table.c.id).where(tenants_table.c.disabled.is_(True))).scalars()
        return (revoked[0], revoked[1], frozenset(recent), frozenset(disabled))


def _bump(k: Kortex) -> None:
    if k.settings.embedded:
        return  # the change itself is the epoch (revocation_epoch): no other process reads this one's store
    try:
        k.redis.incr(epoch_key(k.settings.redis_prefix))
    except RedisError:  # the change is committed; other processes forget the key within the cache TTL
        log.warning("could not announce a key revocation; API processes drop it within their cache TTL",
                    exc_info=True)


def _info(row: Row[Any, Any, Any, Any, Any]) -> KeyInfo:  # _COLUMNS
    return KeyInfo(key_id=row.key_id, name=row.name, role=row.role, created_at=row.created_at,
                   revoked_at=row.revoked_at)


_COLUMNS = (api_keys.c.key_id, api_keys.c.name, api_keys.c.role, api_keys.c.created_at, api_keys.c.revoked_at)


def list_keys(k: Kortex, tenant_id: str, *, after: str | None = None, limit: int | None = None) -> list[KeyInfo]:
    """The tenant's keys, revoked ones included, oldest first; with ``after`` (a key id of the
    tenant's, the last one read) those after it, and at most ``limit`` of them."""
    c = api_keys.c
    query = select(*_COLUMNS).where(c.tenant_id == tenant_id)
    with k.db.connect() as conn:
        if after is not None:
            mark = conn.scalar(select(c.created_at).where(c.tenant_id == tenant_id, c.key_id == after)) \
                if KEY_ID.match(after) else None
            if mark is None:
                raise InvalidInput("after must be the id of one of this tenant's keys", code="validation",
                                   details=[{"field": "after", "message": "not a key of this tenant"}])
            query = query.where(or_(c.created_at > mark, and_(c.created_at == mark, c.key_id > after)))
        query = query.order_by(c.created_at, c.key_id)
        rows = conn.execute(query if limit is None else query.limit(limit)).all()
    return [_info(r) for r in rows]


def create_key(k: Kortex, tenant_id: str, *, name: str = "default", role: str = "chat",
               by: str) -> tuple[KeyInfo, str]:
    """A new key and its secret (shown once: only a hash is stored). ``name`` is stripped; a
    blank one or one with a control character is InvalidInput naming it."""
    valid_role(role)
    check_name(name, "name")  # one line: listed in terminals and UIs, written to the audit trail
    name = name.strip()
    if not name:
        # Given, but blank: refused rather than stored as a name the caller did not give.
        raise InvalidInput("name is blank", code="validation",
                           details=[{"field": "name", "message": "is blank: give the key a name, or none for 'default'"}])
    if len(name) > MAX_KEY_NAME:
        raise InvalidInput(f"name must be 1-{MAX_KEY_NAME} characters", code="validation",
                           details=[{"field": "name", "message": f"longer than {MAX_KEY_NAME} characters"}])
    with k.db.begin() as conn:
        tenants.lock_tenant(conn, tenant_id)  # two creates racing for the last place take turns
        _check_room(conn, tenant_id, k.settings.api_keys.max_active_per_tenant)
        return _issue(conn, tenant_id, name=name, role=role, by=by)


def _check_room(conn: Connection, tenant_id: str, cap: int) -> None:
    """Refuse a key past the tenant's ``cap`` of active ones. A Conflict (409), not RateLimited:
    time does not free a place, only a revocation does, so a Retry-After would send clients
    back in vain (the same as for the last admin key). Rotations replace a key and skip this."""
    active = tenants.active_key_count(conn, tenant_id)
    if active >= cap:
        raise Conflict(f"this tenant has {active} active API keys, the most it may have; revoke one before "
                       "issuing another", code="too_many_keys",
                       details={"limit": "max_active_per_tenant", "active": active, "cap": cap})


def create_tenant(k: Kortex, name: str, *, by: str) -> tuple[TenantRecord, KeyInfo, str]:
    """A new tenant and its first key, an admin one (it can issue the others), with the secret
    shown once; both audited in the same transaction."""
    with k.db.begin() as conn:
        tenant = tenants.create_tenant(conn, name)
        audit.write_entries(conn, [AuditEntry(tenant_id=tenant.id, kind="tenant_created", subject=tenant.name,
                                              ok=True, payload={"by": by})])
        info, secret = _issue(conn, tenant.id, name="default", role=DEFAULT_ROLE, by=by)
    return tenant, info, secret


def _issue(conn: Connection, tenant_id: str, *, name: str, role: str, by: str) -> tuple[KeyInfo, str]:
    issued = tenants.issue_api_key(conn, tenant_id, name=name, role=role)
    row = conn.execute(select(*_COLUMNS).where(api_keys.c.key_id == issued.key_id)).one()
    audit.write_entries(conn, [AuditEntry(tenant_id=tenant_id, kind="key_created", subject=issued.key_id,
                                          ok=True, payload={"by": by, "role": role, "name": name})])
    return _info(row), issued.key


def revoke_key(k: Kortex, tenant_id: str, key_id: str, *, by: str) -> KeyInfo:
    """Revoke one of the tenant's keys (revoking it again changes nothing). The tenant's last
    active key that can manage keys is refused: nobody could issue another."""
    with k.db.begin() as conn:
        # Lock the tenant's keys, so two revocations racing for its last managers cannot both pass.
        rows = conn.execute(select(*_COLUMNS).where(api_keys.c.tenant_id == tenant_id).with_for_update()).all()
        target = next((r for r in rows if r.key_id == key_id), None)
        if target is None:
            raise NotFound("API key not found")
        if target.revoked_at is not None:
            return _info(target)
        managers = [r for r in rows if r.revoked_at is None and r.role in MANAGERS]
        if target.role in MANAGERS and len(managers) == 1:
            raise Conflict("this is the tenant's last active admin key; issue another admin key first",
                           code="last_admin_key")
        now = utcnow()
        conn.execute(update(api_keys).where(api_keys.c.tenant_id == tenant_id, api_keys.c.key_id == key_id)
                     .values(revoked_at=now))
        audit.write_entries(conn, [AuditEntry(tenant_id=tenant_id, kind="key_revoked", subject=key_id, ok=True,
                                              payload={"by": by, "role": target.role})])
    _bump(k)
    return KeyInfo(key_id=target.key_id, name=target.name, role=target.role, created_at=target.created_at,
                   revoked_at=now)


def rotate_key(k: Kortex, tenant_id: str, key_id: str, *, by: str) -> tuple[KeyInfo, str]:
    """Replace a key: a new one with its name and role, and the old one revoked, in one
    transaction (so rotating the last admin key is allowed: another takes its place)."""
    if not KEY_ID.match(key_id):  # cannot exist (and a NUL would reach the database as an outage)
        raise NotFound("API key not found")
    with k.db.begin() as conn:
        old = conn.execute(select(*_COLUMNS).where(api_keys.c.tenant_id == tenant_id, api_keys.c.key_id == key_id)
                           .with_for_update()).first()
        if old is None:
            raise NotFound("API key not found")
        if old.revoked_at is not None:
            raise Conflict("this key is revoked; issue a new one instead", code="key_revoked")
        issued = tenants.issue_api_key(conn, tenant_id, name=old.name, role=old.role)
        conn.execute(update(api_keys).where(api_keys.c.tenant_id == tenant_id, api_keys.c.key_id == key_id)
                     .values(revoked_at=utcnow()))
        row = conn.execute(select(*_COLUMNS).where(api_keys.c.key_id == issued.key_id)).one()
        audit.write_entries(conn, [AuditEntry(tenant_id=tenant_id, kind="key_rotated", subject=key_id, ok=True,
                                              payload={"by": by, "role": old.role, "new_key_id": issued.key_id})])
    _bump(k)
    return _info(row), issued.key


def set_tenant_disabled(k: Kortex, name: str, disabled: bool, *, by: str) -> TenantRecord:
    """Disable (every key stops working, data kept) or enable a tenant by name."""
    with k.db.begin() as conn:
        tenant = tenants.get_tenant_by_name(conn, name)
        if tenant is None:
            raise NotFound(f"no tenant named {name!r}")
        conn.execute(update(tenants_table).where(tenants_table.c.id == tenant.id).values(disabled=disabled))
        audit.write_entries(conn, [AuditEntry(tenant_id=tenant.id, kind="tenant_disabled" if disabled
                                              else "tenant_enabled", subject=name, ok=True, payload={"by": by})])
        active = conn.scalar(select(func.count()).select_from(api_keys).where(
            api_keys.c.tenant_id == tenant.id, api_keys.c.revoked_at.is_(None)))
    if disabled:
        _bump(k)
    log.info("tenant %s %s (%d active keys)", name, "disabled" if disabled else "enabled", active or 0)
    return TenantRecord(id=tenant.id, name=tenant.name, disabled=disabled, settings=tenant.settings,
                        created_at=tenant.created_at)


def authenticate(k: Kortex, key: str) -> Caller:
    """Who ``key`` belongs to (AuthError for any key that is unknown, wrong, revoked or of a
    disabled tenant, all alike)."""
    with k.db.connect() as conn:
        return tenants.authenticate(conn, key)


def valid_key_ids(k: Kortex, key_ids: Collection[str]) -> set[str]:
    """Those of ``key_ids`` that still authenticate (one query): what an API process checks its
    open event streams against when keys are revoked anywhere."""
    with k.db.connect() as conn:
        return tenants.valid_key_ids(conn, key_ids)


def tenant_by_name(k: Kortex, name: str) -> TenantRecord:
    with k.db.connect() as conn:
        tenant = tenants.get_tenant_by_name(conn, name)
    if tenant is None:
        raise NotFound(f"no tenant named {name!r}")
    return tenant


__all__ = ["MANAGERS", "Caller", "KeyInfo", "TenantRecord", "authenticate", "create_key", "create_tenant", "epoch_key", "list_keys", "revocation_epoch", "revoke_key", "rotate_key",
           "set_tenant_disabled", "tenant_by_name", "valid_key_ids"]
