from __future__ import annotations

import uuid

from kortex.ids import uuid7


def test_uuid7_is_versioned_and_time_ordered() -> None:
    ids = [uuid7() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    parsed = uuid.UUID(ids[0])
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
