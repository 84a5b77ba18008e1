"""A throwaway Prometheus (the Debian package's binary) for the tests that query or scrape one."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: install the Debian package 'prometheus' "
                    "(apt-get install -y prometheus; ./dev test does it)")
    return path


@contextlib.contextmanager
def prometheus(root: Path, config: str, *extra: str) -> Iterator[str]:
    """Run Prometheus with ``config`` (its YAML) in ``root`` until the block ends; yields its URL."""
    (root / "prometheus.yml").write_text(config)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = root / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([binary("prometheus"), f"--config.file={root / 'prometheus.yml'}",
                                 f"--web.listen-address=127.0.0.1:{port}", *extra], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"prometheus exited:\n{log_path.read_text()[-3000:]}")
                try:
                    if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"prometheus did not become ready:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
