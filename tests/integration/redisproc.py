"""Private services for fault tests: a redis-server started, killed with SIGKILL and restarted on
the same port (never the shared one; its append-only file survives the kill, as in the compose
file), and a PostgreSQL database of their own."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from kortex.testing.scratch import throwaway_database


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kortex_command(*args: str) -> list[str]:
    """``kortex ...`` as the README runs it, from this virtualenv."""
    exe = Path(sys.executable).with_name("kortex")
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "kortex_cli.main", *args]


class RedisServer:
    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = (self.dir / "redis.log").open("ab")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        # appendfsync always: what Redis acknowledged before the SIGKILL is there after it.
        argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
                "--appendfsync", "always", "--dir", str(self.dir), "--daemonize", "no"]
        deadline = time.monotonic() + timeout
        while True:  # the port may linger a moment after a kill
            self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
            if self._ready(deadline):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.1)

    def _ready(self, deadline: float) -> bool:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.RedisError:
                    time.sleep(0.05)
            return False
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        self.kill()
        self._log.close()


@contextmanager
def private_database(admin_url: str, *, migrated: bool = True) -> Iterator[str]:
    """A throwaway PostgreSQL database of its own. The watchdog's queries are system-wide by
    design, so a test that runs one must not share rows with the session's other services.
    ``migrated=False``: empty, as an operator's database is before ``kortex migrate``."""
    with throwaway_database(admin_url, prefix="kortex_fault", migrated=migrated) as (url, _name):
        yield url
