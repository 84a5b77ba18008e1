"""Fixtures shared by every test: isolated settings, a migrated SQLite template, and a harness
that runs the async domain on a loop thread the way workers and the CLI do."""

from __future__ import annotations

import os
import shutil
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kortex.aio import LoopThread
from kortex.config import Settings
from kortex.container import Kortex
from kortex.storage import chats, tenants
from kortex.storage.migrate import upgrade
from kortex.telemetry import scenarios
from kortex.testing.inline import drive
from kortex.timeparse import utcnow
from kortex.turns import chat

T = TypeVar("T")
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A developer's own KORTEX_* variables or kortex.toml must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("KORTEX_") and not name.startswith("KORTEX_TEST_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "kortex.db"
    upgrade(f"sqlite:///{path}")
    return path


def make_settings(tmp_path: Path, database_url: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "database_url": database_url,
        "redis_url": None,
        "home": tmp_path,
        "testing": {"enable_test_providers": True, "enable_test_tools": True, "scripts_dir": SCRIPTS},
        "turn": {"text_flush_ms": 0},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return Settings(**base)


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "kortex.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


class Harness:
    """A container on its own loop thread, plus shortcuts tests use often."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = LoopThread("kortex-test-loop")
        self.k = Kortex.create(settings)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return self.loop.run(coro, timeout)

    def close(self) -> None:
        self.run(self.k.aclose())
        self.loop.stop()

    def tenant(self, name: str) -> str:
        async def work() -> str:
            async with self.k.db.begin() as conn:
                found = await tenants.get_tenant_by_name(conn, name)
                return found.id if found else (await tenants.create_tenant(conn, name)).id

        return self.run(work())

    def api_key(self, tenant_id: str) -> str:
        async def work() -> str:
            async with self.k.db.begin() as conn:
                return (await tenants.issue_api_key(conn, tenant_id)).key

        return self.run(work())

    def seed(self, tenant_id: str, scenario: str = "checkout-deploy-regression") -> dict[str, int]:
        async def work() -> dict[str, int]:
            async with self.k.db.begin() as conn:
                return await scenarios.seed(conn, tenant_id, scenarios.get_scenario(scenario), now=utcnow())

        return self.run(work())

    def ask(self, tenant_id: str, content: str, model: str | None = None, session_id: str | None = None) -> Any:
        """Post a message and drive the whole turn in-process; returns the finished turn."""

        async def work() -> Any:
            sid = session_id or (await chat.create_session(self.k, tenant_id, "test", model)).id
            posted = await chat.post_message(self.k, tenant_id, sid, content, model=model)
            await drive(self.k, posted.handoff)
            return await chat.get_turn(self.k, tenant_id, posted.turn.id)

        return self.run(work())

    def messages(self, tenant_id: str, session_id: str) -> list[Any]:
        async def work() -> list[Any]:
            async with self.k.db.connect() as conn:
                return await chats.list_messages(conn, tenant_id, session_id, limit=1000)

        return self.run(work())

    def events(self, turn_id: str) -> list[Any]:
        return self.run(self.k.events.read(turn_id))


@pytest.fixture
def harness_factory(tmp_path: Path, sqlite_url: str) -> Iterator[Any]:
    made: list[Harness] = []

    def factory(**overrides: Any) -> Harness:
        h = Harness(make_settings(tmp_path, sqlite_url, **overrides))
        made.append(h)
        return h

    yield factory
    for h in made:
        h.close()


@pytest.fixture
def harness(harness_factory: Any) -> Harness:
    return harness_factory()  # type: ignore[no-any-return]
