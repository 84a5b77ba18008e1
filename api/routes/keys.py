"""The tenant's API keys, for keys whose role may manage them (admin)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from api.deps import AuthCache, CallerDep, KortexDep, allowed
from api.openapi import ERRORS
from api.schemas import CreateKey, KeyCreated, KeyList, KeyOut
from kortex import keys
from kortex.access import Permission

router = APIRouter(prefix="/v1/keys", tags=["keys"], dependencies=[Depends(allowed(Permission.KEYS))], responses=ERRORS)


@router.get("", response_model=KeyList)
def list_keys(
    k: KortexDep,
    caller: CallerDep,
    after: Annotated[str | None, Query(max_length=12, pattern=r"^[0-9a-f]{12}$",
                                       description="next_after of the page read last: a key id")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> KeyList:
    """The tenant's keys, revoked ones included, oldest first, a page at a time; never a secret."""
    found = keys.list_keys(k, caller.tenant.id, after=after, limit=limit)
    return KeyList(keys=[KeyOut.of(i) for i in found], next_after=found[-1].key_id if len(found) == limit else None)


@router.post("", status_code=201, response_model=KeyCreated,
             responses={409: {"description": "the tenant has as many active keys as it may: revoke one first"}})
def create_key(body: CreateKey, k: KortexDep, caller: CallerDep, response: Response) -> KeyCreated:
    """Issue a key; the answer is the only time its secret is shown. A tenant has at most
    `[api_keys] max_active_per_tenant` active keys (100)."""
    info, secret = keys.create_key(k, caller.tenant.id, name=body.name, role=body.role, by=f"key:{caller.key_id}")
    response.headers["Location"] = f"/v1/keys/{info.key_id}"
    return KeyCreated(**KeyOut.of(info).model_dump(), key=secret)


@router.delete("/{key_id}", response_model=KeyOut,
               responses={409: {"description": "the tenant's last active admin key cannot be revoked"}})
def revoke_key(key_id: str, k: KortexDep, caller: CallerDep, request: Request) -> KeyOut:
    """Revoke a key: it fails at once here and within about a second on every other API
    process. Revoking a revoked key answers the same again."""
    info = keys.revoke_key(k, caller.tenant.id, key_id, by=f"key:{caller.key_id}")
    cache: AuthCache = request.app.state.auth_cache
    cache.clear()  # this process at once; the others when they see the revocation epoch move
    return KeyOut.of(info)


@router.post("/{key_id}/rotate", status_code=201, response_model=KeyCreated,
             responses={409: {"description": "the key is already revoked"}})
def rotate_key(key_id: str, k: KortexDep, caller: CallerDep, request: Request, response: Response) -> KeyCreated:
    """Replace a key: a new key with the same name and role (its secret shown this once), and the
    old one revoked, together."""
    info, secret = keys.rotate_key(k, caller.tenant.id, key_id, by=f"key:{caller.key_id}")
    cache: AuthCache = request.app.state.auth_cache
    cache.clear()
    response.headers["Location"] = f"/v1/keys/{info.key_id}"
    return KeyCreated(**KeyOut.of(info).model_dump(), key=secret)
