"""Fixtures shared by every test: isolated settings, a migrated SQLite template, and a harness
that runs the async domain on a loop thread the way workers and the CLI do."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kortex.config import Settings
from kortex.container import Kortex
from kortex.messages import ToolCall
from kortex.storage import chats, tenants
from kortex.storage.migrate import upgrade
from kortex.stream import embedded
from kortex.telemetry import scenarios
from kortex.testing.inline import drive
from kortex.timeparse import utcnow
from kortex.tools.spec import ToolContext
from kortex.turns import chat

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A developer's own KORTEX_* variables or kortex.toml must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("KORTEX_") and not name.startswith("KORTEX_TEST_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module", autouse=True)
def _own_embedded_redis() -> Iterator[None]:
    """Each test file's embedded Redis (one in-process server, kortex/stream/embedded.py) starts
    empty: the files share a process and the default prefix, so one file's admission slots were
    another's (a watchdog sweep freed slots it never took, and said so in its log). Per file, not
    per test: a file's module-scoped embedded worker and its tests must share one server."""
    kept = embedded._server
    embedded._server = None
    yield
    embedded._server = kept


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
        # Tests build many apps in one process: freezing the heap each time would keep their garbage.
        "settle_heap": False,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return Settings(**base)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Any]:
    """A redis-server of the test's own, on its own port (never the shared one), for tests that
    stop, pause or kill it (tests/integration/redisproc.py)."""
    from tests.integration.redisproc import RedisServer

    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "kortex.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


class Harness:
    """A container plus shortcuts tests use often."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.k = Kortex.create(settings)

    def close(self) -> None:
        self.k.close()

    def tenant(self, name: str) -> str:
        def work() -> str:
            with self.k.db.begin() as conn:
                found = tenants.get_tenant_by_name(conn, name)
                return found.id if found else (tenants.create_tenant(conn, name)).id

        return work()

    def api_key(self, tenant_id: str, role: str = "admin") -> str:
        def work() -> str:
            with self.k.db.begin() as conn:
                return (tenants.issue_api_key(conn, tenant_id, role=role)).key

        return work()

    def seed(self, tenant_id: str, scenario: str = "checkout-deploy-regression") -> dict[str, int]:
        def work() -> dict[str, int]:
            with self.k.db.begin() as conn:
                return scenarios.seed(conn, tenant_id, scenarios.get_scenario(scenario), now=utcnow())

        return work()

    def ask(self, tenant_id: str, content: str, model: str | None = None, session_id: str | None = None) -> Any:
        """Post a message and drive the whole turn in-process; returns the finished turn."""

        def work() -> Any:
            sid = session_id or (chat.create_session(self.k, tenant_id, "test", model)).id
            posted = chat.post_message(self.k, tenant_id, sid, content, model=model)
            drive(self.k, posted.handoff)
            return chat.get_turn(self.k, tenant_id, posted.turn.id)

        return work()

    def messages(self, tenant_id: str, session_id: str) -> list[Any]:
        def work() -> list[Any]:
            with self.k.db.connect() as conn:
                return chats.list_messages(conn, tenant_id, session_id, limit=1000)

        return work()

    def events(self, turn_id: str) -> list[Any]:
        return self.k.events.read(turn_id)

    def billed(self, turn_id: str) -> tuple[int, int, float, int]:
        """The sum over the turn's LLM call audit rows (input and output tokens, cost), and how
        many there are: what a turn's usage must agree with."""
        from sqlalchemy import func, select

        from kortex.storage.schema import decisions

        with self.k.db.connect() as conn:
            row = conn.execute(select(func.coalesce(func.sum(decisions.c.input_tokens), 0),
                                      func.coalesce(func.sum(decisions.c.output_tokens), 0),
                                      func.coalesce(func.sum(decisions.c.cost_usd), 0.0), func.count())
                               .where(decisions.c.turn_id == turn_id, decisions.c.kind == "llm_call")).one()
        return int(row[0]), int(row[1]), float(row[2]), int(row[3])

    def call(self, tenant_id: str, name: str, args: dict[str, Any], *, now: Any = None,
             call_id: str = "c1", turn_id: str | None = None) -> Any:
        """Run one tool call through the pipeline, as a tool task would."""
        ctx = ToolContext(tenant_id=tenant_id, session_id=None, turn_id=turn_id, call_id=call_id, step=0,
                          now=now or utcnow(), sources=self.k.sources, services=dict(self.k.services))
        return self.k.pipeline.run(ToolCall(id=call_id, name=name, arguments=args), ctx)

    def page_through(self, tenant_id: str, name: str, args: dict[str, Any], field: str,
                     max_pages: int = 100) -> tuple[list[Any], int]:
        """Every item of a paged result, following next_cursor; (items, pages)."""
        items: list[Any] = []
        cursor = None
        for pages in range(1, max_pages + 1):
            result = self.call(tenant_id, name, {**args, **({"cursor": cursor} if cursor else {})})
            assert not result.is_error, result.content
            items += result.content[field]
            cursor = result.content.get("next_cursor")
            if not cursor:
                return items, pages
        raise AssertionError(f"{name} did not stop paging after {max_pages} pages")


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


#: folders whose tests start processes (workers, servers, the CLI): a file of them takes a
#: minute or more, so they are handed out first, and the run does not end on one such file
#: while the other test processes sit idle (pytest-xdist --dist loadfile deals files in order)
_SLOW_FIRST = ("tests/integration/", "tests/kortex_cli/", "tests/bench/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid
        return next((i for i, folder in enumerate(_SLOW_FIRST) if path.startswith(folder)), len(_SLOW_FIRST))

    items.sort(key=rank)  # stable: the order within a file and among the rest stays
