"""How long a busy thread keeps the GIL from a thread that wants it, in a server process.

A Kortex server hands work between threads all the time: the API's event loop and its
database threads (api/deps.py), the turns worker's Celery threads, its event loop and its
I/O threads (kortex/turns/engine.py). A thread that wakes (its SQL answered, a step handed
over) must take the GIL from whichever thread is running Python, and CPython makes it wait
for that thread's switch interval: 5 ms by default. A tenant's first event crosses four or
five such hand-offs.

Measured with ``./dev bench --only fairness`` (tenant B's first event p50 while tenant A
floods 500 paced turns; idle 15-19 ms), runs alternating between 1 and 5 ms: with another
process on the host taking a tenth of a core (a /proc sampler left running), 32.5-34.7 ms at
1 ms against 40.1-41.3 at 5 ms (five runs and three); on an otherwise quiet host no
difference beyond the noise (34.9-39.8 against 35.6-46.8, medians 37.1 and 38.1, five
pairs). CPU per turn did not move (sampler running; paced N=100: 64.1 against 63.6 ms;
zero-latency turns 36.0 against 36.4 ms). So it is the default: hosts are seldom quiet, and
it costs nothing.
"""

from __future__ import annotations

import sys


def apply(interval_ms: float) -> None:
    """Set this process's switch interval (every thread of it, and children forked later)."""
    sys.setswitchinterval(interval_ms / 1000)
