"""kombu's Redis transport, with one client per channel instead of one per command, and
acknowledgements of no-ack queues skipped.

kombu builds a new redis-py client object (and its table of ~200 reply callbacks) for every
acknowledgement and every unacked-index update of every message: 5% of a turns worker's CPU
in a burst (py-spy). A client over the channel's shared connection pool is thread-safe, so the
channel keeps one, and drops it whenever kombu drops the pool it was made with.

A queue consumed without acks (the turns queue, workers/app.py) keeps no unacked entry, yet
Celery still acks each of its messages, and kombu's virtual channel sends that ack to Redis
(a pipeline removing entries that do not exist: 5% of a busy turns worker). kombu's Message
skips the ack of a consumer listed in ``no_ack_consumers``, which the virtual channel never
fills; this one does.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _kx_client: Any = None
    _kx_pool: Any = None
    no_ack_consumers: set[str] | None = None

    def basic_consume(self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any) -> Any:
        if no_ack:
            if self.no_ack_consumers is None:
                self.no_ack_consumers = set()
            self.no_ack_consumers.add(consumer_tag)
            inner = callback

            def callback(message: Any) -> Any:
                # Message.ack looks the consumer up by the tag in its delivery info, which
                # the virtual transport leaves out.
                message.delivery_info["consumer_tag"] = consumer_tag
                return inner(message)

        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        if self.no_ack_consumers is not None:
            self.no_ack_consumers.discard(consumer_tag)
        return super().basic_cancel(consumer_tag)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        if self._kx_client is None or self._kx_pool is not pool:
            self._kx_client, self._kx_pool = super()._create_client(), pool
        return self._kx_client


class Transport(kombu_redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"
