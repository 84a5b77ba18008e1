"""A redis-py asyncio connection whose sends leave at once: its socket timeout is taken off and
handed back for the caller to bound each round trip with.

On Python 3.11 redis-py sends every command on a connection that has a socket timeout from a
task of its own (``asyncio.wait_for``): a turn of the event loop before the command leaves.
On a loop streaming hundreds of turns a turn lasts 100 ms and more, and the step engine's
stream writes and the stream hub's reads each paid it on every round trip.
"""

from __future__ import annotations

from redis.asyncio.connection import AbstractConnection


def untimed(conn: AbstractConnection, default: float) -> float:
    """Take ``conn``'s socket timeout off it; returns it (``default`` if it had none), the bound
    the caller now puts around each exchange itself (``asyncio.timeout``)."""
    bound = float(conn.socket_timeout or default)
    conn.socket_timeout = None
    return bound
