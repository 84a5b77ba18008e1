"""How long a busy thread keeps the GIL from a thread that wants it, in a server process.

A Kortex server hands work between threads all the time: the API's event loop and its
database threads (api/deps.py), the turns worker's Celery threads, its event loop and its
I/O threads (kortex/turns/engine.py). A thread that wakes (its SQL answered, a step handed
over) must take the GIL from whichever thread is running Python, and CPython makes it wait
for that thread's switch interval: 5 ms by default. A tenant's first event crosses four or
five such hand-offs, so while another tenant floods the process each of them waited out
most of an interval. With 1 ms (``switch_interval_ms``), tenant B's first event during
tenant A's flood of 500 paced turns (``./dev bench --only fairness``, four runs each) came
after 33-35 ms instead of 40-41 (idle: 16-17 ms); CPU per turn did not move (paced N=100:
64.1 against 63.6 ms; zero-latency turns 36.0 against 36.4 ms).
"""

from __future__ import annotations

import sys


def apply(interval_ms: float) -> None:
    """Set this process's switch interval (every thread of it, and children forked later)."""
    sys.setswitchinterval(interval_ms / 1000)
