"""Servers let a waking thread take the GIL after 1 ms, not CPython's 5: the API as it starts,
a worker before its pool's threads start (kortex/switching.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex import switching
from kortex.config import Settings
from tests.conftest import make_settings


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_default_is_one_millisecond_and_apply_sets_it_for_the_process() -> None:
    assert Settings(redis_url=None).switch_interval_ms == 1.0
    switching.apply(2.5)
    assert sys.getswitchinterval() == pytest.approx(0.0025)


def test_out_of_range_intervals_are_refused() -> None:
    for bad in (0, 0.05, 101):
        with pytest.raises(ValueError, match="switch_interval_ms"):
            Settings(redis_url=None, switch_interval_ms=bad)


def test_the_api_sets_its_interval_as_it_starts(tmp_path: Path, sqlite_url: str) -> None:
    settings = make_settings(tmp_path, sqlite_url, switch_interval_ms=3.0)
    sys.setswitchinterval(0.005)
    with TestClient(create_app(settings, dispatch=lambda handoff: None, embedded_worker=False)):
        assert sys.getswitchinterval() == pytest.approx(0.003)


def test_a_worker_sets_its_interval_at_worker_init(tmp_path: Path, sqlite_url: str) -> None:
    from workers import app as app_module

    conf = app_module.app.conf
    before = conf.kortex_settings
    conf.kortex_settings = make_settings(tmp_path, sqlite_url, switch_interval_ms=4.0)
    try:
        sys.setswitchinterval(0.005)
        app_module._switch_sooner()
        assert sys.getswitchinterval() == pytest.approx(0.004)
    finally:
        conf.kortex_settings = before
