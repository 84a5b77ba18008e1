"""Tenants and their API keys. Keys are stored as a public id plus the SHA-256 of the secret."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Collection
from dataclasses import asdict, dataclass

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from kortex.access import DEFAULT_ROLE, valid_role
from kortex.errors import AuthError, Conflict, InvalidInput
from kortex.ids import new_api_key_parts, uuid7
from kortex.storage.records import TenantRecord
from kortex.storage.schema import api_keys, tenants
from kortex.text import check_name
from kortex.timeparse import utcnow

_KEY = re.compile(r"^kx_([0-9a-f]{12})_([A-Za-z0-9]{20,80})\Z")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,199}\Z")


def hash_secret(secret: str) -> str:
    # The secret is 240 random bits, so a plain digest is as strong as a slow KDF here and
    # keeps authentication cheap on every request.
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class IssuedKey:
    tenant_id: str
    key_id: str
    key: str  # shown once, never stored
    role: str = DEFAULT_ROLE


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from: the key's tenant, its role and its public id (what audit rows
    name as the actor; never the secret)."""

    tenant: TenantRecord
    role: str
    key_id: str = ""


def create_tenant(conn: Connection, name: str) -> TenantRecord:
    check_name(name, "name")  # said as such: the pattern below would refuse it as merely unusual
    name = name.strip()
    if not _NAME.match(name):
        rule = "1-200 letters, digits, spaces or ._- starting with a letter or digit"
        raise InvalidInput(f"tenant name: {rule}", code="validation", details=[{"field": "name", "message": rule}])
    exists = conn.scalar(select(tenants.c.id).where(tenants.c.name == name))
    if exists:
        raise Conflict(f"tenant {name!r} already exists", code="tenant_exists")
    tenant = TenantRecord(id=uuid7(), name=name, disabled=False, settings={}, created_at=utcnow())
    conn.execute(tenants.insert().values(**asdict(tenant)))
    return tenant


def lock_tenant(conn: Connection, tenant_id: str) -> None:
    """Hold the tenant's row until the transaction ends, so that what is counted next (its
    active keys, its unfinished post-mortem items) stays true until the new row is in: two
    transactions that both count under it take turns, and the second counts the first's row.
    PostgreSQL: a row lock that key-share readers (inserts naming the tenant) pass. SQLite has
    no row locks, and its driver begins a transaction only at the first write: reads before it
    see no lock at all. A write that changes nothing takes the database's write lock instead."""
    if conn.dialect.name == "sqlite":
        conn.execute(update(tenants).where(tenants.c.id == tenant_id).values(disabled=tenants.c.disabled))
    else:
        conn.execute(select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update(key_share=True))


def active_key_count(conn: Connection, tenant_id: str) -> int:
    """The tenant's keys not revoked."""
    return int(conn.scalar(select(func.count()).select_from(api_keys)
                           .where(api_keys.c.tenant_id == tenant_id, api_keys.c.revoked_at.is_(None))) or 0)


def get_tenant_by_name(conn: Connection, name: str) -> TenantRecord | None:
    row = (conn.execute(select(tenants).where(tenants.c.name == name))).first()
    return TenantRecord.from_row(row) if row else None


def issue_api_key(conn: Connection, tenant_id: str, name: str = "default", role: str = DEFAULT_ROLE) -> IssuedKey:
    valid_role(role)
    key_id, secret = new_api_key_parts()
    conn.execute(
        api_keys.insert().values(
            id=uuid7(), tenant_id=tenant_id, key_id=key_id, secret_hash=hash_secret(secret),
            name=name[:200], role=role, created_at=utcnow(),
        )
    )
    return IssuedKey(tenant_id=tenant_id, key_id=key_id, key=f"kx_{key_id}_{secret}", role=role)


def valid_key_ids(conn: Connection, key_ids: Collection[str]) -> set[str]:
    """Those of ``key_ids`` that still authenticate: not revoked, their tenant not disabled."""
    if not key_ids:
        return set()
    rows = conn.execute(select(api_keys.c.key_id).join(tenants, tenants.c.id == api_keys.c.tenant_id)
                        .where(api_keys.c.key_id.in_(list(key_ids)), api_keys.c.revoked_at.is_(None),
                               tenants.c.disabled.is_(False))).scalars()
    return set(rows)


def authenticate(conn: Connection, key: str) -> Caller:
    """The tenant owning ``key`` and the key's role; every failure looks the same to the caller."""
    match = _KEY.match(key or "")
    if not match:
        raise AuthError("invalid API key")
    key_id, secret = match.groups()
    row = (
        conn.execute(
            select(api_keys.c.secret_hash, api_keys.c.revoked_at, api_keys.c.role, tenants)
            .join(tenants, tenants.c.id == api_keys.c.tenant_id)
            .where(api_keys.c.key_id == key_id)
        )
    ).first()
    expected = row.secret_hash if row else hash_secret("x")  # compare anyway: no timing hint
    ok = hmac.compare_digest(expected, hash_secret(secret))
    if not row or not ok or row.revoked_at is not None or row.disabled:
        raise AuthError("invalid API key")
    return Caller(tenant=TenantRecord.from_row(row), role=row.role, key_id=key_id)
