"""``--metrics-port`` of ``kortex beat`` and ``kortex worker``, as deployed: beat's scrape has
every queue's depth and answers within about a second when Redis is down or hung (Prometheus
gives a scrape 10 s, and a beat that looks down loses its watchdog counters with it), and
with ``[metrics] token`` set these ports, which listen on every address, want the token."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import PG_ADMIN, Service, service_env
from tests.integration.redisproc import RedisServer, free_port, kortex_command, private_database

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOKEN = "metrics-s3cret"


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with private_database(PG_ADMIN) as url:
        yield url


def _start(name: str, args: list[str], env: dict[str, str], log: Path, port: int, ready: str) -> Service:
    service = Service(name, kortex_command(*args, "--metrics-port", str(port)), env, log)
    try:
        service.wait_for(lambda: ready in service.output())
    except BaseException:
        service.stop()
        raise
    return service


def _scrape(port: int, token: str | None = None) -> tuple[httpx.Response, float]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=headers, timeout=5)
    return response, time.monotonic() - started


def _beat(pg_url: str, redis_server: RedisServer, tmp_path: Path, port: int) -> Service:
    env = service_env(pg_url, "kxbeatmetrics", KORTEX_REDIS_URL=redis_server.url)
    return _start("beat", ["beat"], env, tmp_path / "beat.log", port, "took the lead")


def test_beat_reports_every_queue_s_depth(pg_url: str, redis_server: RedisServer, tmp_path: Path) -> None:
    port = free_port()
    beat = _beat(pg_url, redis_server, tmp_path, port)
    try:
        up, _ = _scrape(port)
        assert up.status_code == 200  # no token set: none asked for
        assert {line.rsplit(" ", 1)[0] for line in up.text.splitlines() if line.startswith("kortex_queue_depth{")} == {
            f'kortex_queue_depth{{queue="{queue}"}}' for queue in ("turns", "tools", "batch")}
    finally:
        beat.stop()


def test_beat_answers_a_scrape_at_once_while_redis_is_hung_or_down(
        pg_url: str, redis_server: RedisServer, tmp_path: Path) -> None:
    port = free_port()
    beat = _beat(pg_url, redis_server, tmp_path, port)
    try:
        up, _ = _scrape(port)
        assert up.status_code == 200 and 'kortex_queue_depth{queue="turns"} 0.0' in up.text

        assert redis_server.proc is not None
        os.kill(redis_server.proc.pid, signal.SIGSTOP)  # hung: connections open, nothing answers
        try:
            hung, took = _scrape(port)
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        assert hung.status_code == 200 and took < 1.5, took
        assert "kortex_queue_depth{" not in hung.text  # missing, not a stale figure

        redis_server.kill()  # down: connections refused
        for _ in range(3):
            down, took = _scrape(port)
            assert down.status_code == 200 and took < 1.5, took
            assert "kortex_queue_depth{" not in down.text and "kortex_turns_started_total" in down.text
        assert beat.proc.poll() is None, beat.output()[-4000:]
    finally:
        beat.stop()


def test_beat_and_worker_metrics_ports_want_the_token_when_one_is_set(
        pg_url: str, redis_server: RedisServer, tmp_path: Path) -> None:
    env = service_env(pg_url, "kxtokenmetrics", KORTEX_REDIS_URL=redis_server.url, KORTEX_METRICS__TOKEN=TOKEN)
    ports = {"beat": free_port(), "worker": free_port()}
    beat = Service("beat", kortex_command("beat", "--metrics-port", str(ports["beat"])), env, tmp_path / "beat.log")
    worker = Service("worker", kortex_command("worker", "--queues", "tools", "--concurrency", "2", "--metrics-port",
                                              str(ports["worker"])), env, tmp_path / "worker.log")
    try:
        beat.wait_for(lambda: "took the lead" in beat.output())  # both start at once
        worker.wait_for(lambda: " ready." in worker.output())
        for name, port in ports.items():
            bare, _ = _scrape(port)
            assert bare.status_code == 401 and "kortex_" not in bare.text, name
            wrong, _ = _scrape(port, "not-" + TOKEN)
            assert wrong.status_code == 401, name
            right, _ = _scrape(port, TOKEN)
            assert right.status_code == 200 and "kortex_turns_started_total" in right.text, name
    finally:
        worker.stop()
        beat.stop()
