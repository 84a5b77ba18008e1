"""kombu's Redis transport, with one client per channel instead of one per command.

kombu builds a new redis-py client object (and its table of ~200 reply callbacks) for every
acknowledgement and every unacked-index update of every message: 5% of a turns worker's CPU
in a burst (py-spy). A client over the channel's shared connection pool is thread-safe, so the
channel keeps one, and drops it whenever kombu drops the pool it was made with.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    _kx_client: Any = None
    _kx_pool: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        if self._kx_client is None or self._kx_pool is not pool:
            self._kx_client, self._kx_pool = super()._create_client(), pool
        return self._kx_client


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
