"""Who may do what with an API key: each key has one role, each role a set of permissions.
Policy as data: the table below is the whole of it, and every API route names the permission
it needs (deny by default: a route that names none is not reachable with a key at all)."""

from __future__ import annotations

from enum import StrEnum

from kortex.errors import Forbidden, InvalidInput


class Permission(StrEnum):
    CHAT = "chat"        # sessions, turns, their events; read the tool and provider catalogs, proposals
    DECIDE = "decide"    # confirm or reject a proposed action: an operator's call
    INGEST = "ingest"    # write telemetry into the embedded store
    KEYS = "keys"        # issue, list and revoke the tenant's API keys


ROLES: dict[str, frozenset[Permission]] = {
    "admin": frozenset(Permission),
    "operator": frozenset({Permission.CHAT, Permission.DECIDE}),
    "chat": frozenset({Permission.CHAT}),
    "ingest": frozenset({Permission.INGEST}),
}
DEFAULT_ROLE = "admin"  # the first key of a tenant can do everything its tenant may


def valid_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r}; use one of: {', '.join(ROLES)}")
    return role


def require(role: str, permission: Permission) -> None:
    if permission not in ROLES.get(role, frozenset()):
        raise Forbidden(f"this API key's role ({role}) does not allow {permission.value}; "
                        f"roles that do: {', '.join(r for r, p in ROLES.items() if permission in p)}")


__all__ = ["DEFAULT_ROLE", "ROLES", "Permission", "require", "valid_role"]
