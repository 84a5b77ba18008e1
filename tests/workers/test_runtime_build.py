"""A worker whose container its configuration refuses stops, with one line and a failure
status, instead of reporting ready and failing every task; an outage is retried as before."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.worker import state

from kortex.errors import ConfigError
from workers import runtime

REPO = Path(__file__).resolve().parents[2]
UNSCOPED_PROMETHEUS = '[telemetry]\nmetrics = "prometheus"\n[telemetry.prometheus]\nurl = "http://127.0.0.1:9"\n'


@pytest.fixture
def should_stop() -> Iterator[None]:
    yield
    state.should_stop = None  # this test process runs no worker that could have set it


def test_a_refused_configuration_stops_the_worker_an_outage_does_not(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, should_stop: None) -> None:
    def refused(settings: object) -> None:
        raise ConfigError("telemetry.prometheus: every tenant could read every other tenant's metrics")

    def down(settings: object) -> None:
        raise ConnectionError("database is down")

    monkeypatch.setattr(runtime, "_settle", lambda settings: None)
    monkeypatch.setattr(runtime, "kortex", down)
    runtime.build()
    assert state.should_stop is None  # its first task tries again
    monkeypatch.setattr(runtime, "kortex", refused)
    with caplog.at_level(logging.ERROR, logger="workers.runtime"):
        runtime.build()
    assert state.should_stop == 1
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.exc_info is None and "every tenant could read" in record.getMessage()


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_celery_started_worker_exits_1_on_a_configuration_its_container_refuses(
        tmp_path: Path, pool: str) -> None:
    """``celery -A workers.app worker``: no CLI check runs before it."""
    (tmp_path / "kortex.toml").write_text(UNSCOPED_PROMETHEUS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env.update(HOME=str(tmp_path), KORTEX_HOME=str(tmp_path / "kortex"), PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-P", pool, "-c", "1",
                             "-Q", "turns", "-n", f"config-test-{os.getpid()}@%h"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "cannot run with this configuration: telemetry.prometheus" in result.stderr
    assert "Traceback" not in result.stderr
