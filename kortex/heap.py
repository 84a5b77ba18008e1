"""The garbage collector's settings for a long-running Kortex process.

CPython's defaults (a young collection every 700 net allocations, a full one every 100 young
ones) suit short scripts. A server process holds hundreds of thousands of long-lived objects
(modules, open streams, step coroutines) and allocates a few per token; its collections
then walk those objects again and again, and every full one stops the event loop. Measured
with ``bench/sse.py`` (2,000 streams x 5 events/s through the stream hub, one process): lag
p99 158 ms and 44% CPU with the defaults; 35 ms and 35% with what ``settle`` sets. Freezing
alone gave 101 ms; the thresholds alone 37 ms.

Cycles are still collected, less often: the young generation waits for 10,000 net
allocations (a few MB at most), and a full collection still runs once the objects that
survived since the last one reach a quarter of all tracked objects (CPython's own rule).
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 10, 10)


def settle() -> None:
    """Call once the process has started (its modules imported, its app built): what exists
    then lives as long as the process, so collections stop scanning it (``gc.freeze``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
