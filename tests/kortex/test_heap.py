"""A started server settles its heap: what exists then is frozen out of collections, and the
young generation is collected less often. In a child process: freezing this one would keep
every test's garbage."""

from __future__ import annotations

import json
import subprocess
import sys

from kortex import heap


def test_settle_freezes_the_started_heap_and_raises_the_thresholds() -> None:
    code = ("import gc, json; from kortex import heap; import api.main; "
            "before = [gc.get_freeze_count(), list(gc.get_threshold())]; heap.settle(); "
            "print(json.dumps([before, [gc.get_freeze_count(), list(gc.get_threshold())]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    (frozen_before, default), (frozen_after, settled) = json.loads(out.stdout)
    assert frozen_before == 0 and frozen_after > 10_000  # the imported app's objects, at least
    assert default == [700, 10, 10] and settled == list(heap.THRESHOLDS)
