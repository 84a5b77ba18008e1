"""Opaque paging cursors, signed so a model can neither forge one nor reuse it to widen a
different query: each cursor is bound to the tenant and the arguments that produced it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from kortex.errors import InvalidInput


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _binding(bind: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(bind, sort_keys=True, default=str).encode()).hexdigest()[:16]


class CursorCodec:
    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("cursor key must be at least 16 bytes")
        self._key = key

    def encode(self, position: dict[str, Any], bind: dict[str, Any]) -> str:
        body = json.dumps({"p": position, "b": _binding(bind)}, separators=(",", ":"), default=str).encode()
        mac = hmac.new(self._key, body, hashlib.sha256).digest()[:16]
        return f"{_b64(body)}.{_b64(mac)}"

    def decode(self, token: str, bind: dict[str, Any]) -> dict[str, Any]:
        try:
            body_part, mac_part = token.split(".", 1)
            body = _unb64(body_part)
            mac = _unb64(mac_part)
        except (ValueError, TypeError):
            raise InvalidInput("cursor is not valid; omit it to start from the first page") from None
        expected = hmac.new(self._key, body, hashlib.sha256).digest()[:16]
        if not hmac.compare_digest(mac, expected):
            raise InvalidInput("cursor is not valid; omit it to start from the first page")
        data = json.loads(body)
        if data.get("b") != _binding(bind):
            raise InvalidInput("cursor belongs to a different query; repeat the same arguments with it")
        return dict(data.get("p") or {})


def derive_key(secret: str | None, fallback_material: str) -> bytes:
    """The configured secret, or a key derived from material every process shares."""
    material = secret if secret else f"kortex-cursor:{fallback_material}"
    return hashlib.sha256(material.encode()).digest()
