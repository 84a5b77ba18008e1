"""Identifier generation: time-ordered UUIDv7 strings and API-key material."""

from __future__ import annotations

import os
import secrets
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def uuid7() -> str:
    """A UUIDv7 (RFC 9562) string: sorts by creation time, so B-tree inserts stay local.

    Within one millisecond a 12-bit counter keeps ids from one process monotonic.
    """
    global _last_ms, _seq
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _seq += 1
            if _seq > 0xFFF:  # counter exhausted: borrow the next millisecond
                ms += 1
                _seq = 0
        else:
            _seq = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave headroom for the counter
        _last_ms = ms
        seq = _seq
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    return str(uuid.UUID(int=value))


def is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        return False
    return True


def new_call_id() -> str:
    """Tool call id for providers that do not assign one (offline analyst, pseudo-tools)."""
    return "call_" + secrets.token_hex(12)


def new_api_key_parts() -> tuple[str, str]:
    """Return (public key id, secret). The full key shown to the user is ``kx_<id>_<secret>``."""
    return secrets.token_hex(6), secrets.token_urlsafe(30).replace("-", "A").replace("_", "b")
