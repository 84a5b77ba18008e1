"""A PostgreSQL outage while a tool runs: the result it computed is kept (in the Redis spool)
and stored when the task is retried, so the model and the client get the real result, not a
timeout. Runs on a private PostgreSQL cluster this test starts and stops on its own port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kortex.errors import StorageError
from kortex.messages import ToolMessage
from kortex.storage import chats
from kortex.storage.migrate import upgrade
from kortex.turns import chat, spool
from kortex.turns.step import run_step
from kortex.turns.toolrun import run_tool
from tests.conftest import Harness, make_settings
from tests.integration.conftest import REDIS_URL

BIN = Path("/usr/lib/postgresql") / (sorted(os.listdir("/usr/lib/postgresql"))[-1] if os.path.isdir(
    "/usr/lib/postgresql") else "none") / "bin"


class PrivatePostgres:
    """initdb + pg_ctl as the postgres user, in a temporary directory, on a free port."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "pgdata"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        root.chmod(0o777)
        self._run(str(BIN / "initdb"), "-D", str(self.dir), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.dir), "-w", "-l", str(self.dir / "log"), "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self) -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.dir), "-w", "-m", "fast", "stop")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture
def outage_stack() -> Iterator[tuple[Harness, PrivatePostgres]]:
    if not (BIN / "initdb").exists():
        pytest.fail("PostgreSQL server binaries are not installed (Debian: postgresql)")
    # Not under pytest's tmp dir: the server runs as the postgres user, who cannot enter it.
    root = Path(tempfile.mkdtemp(prefix="kortex-pg-"))
    pg = PrivatePostgres(root)
    prefix = f"kxout-{uuid.uuid4().hex[:8]}"
    h: Harness | None = None
    try:
        upgrade(pg.url)
        h = Harness(make_settings(root, pg.url, redis_url=REDIS_URL, redis_prefix=prefix))
        yield h, pg
    finally:
        if h is not None:
            for key in h.k.redis.scan_iter(f"{prefix}:*"):
                h.k.redis.delete(key)
            h.close()
        try:
            pg.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(root, ignore_errors=True)


def _retrying(work: Any, tries: int = 10) -> Any:
    """What the tool task's autoretry does: run again while the database still refuses."""
    for _ in range(tries - 1):
        try:
            return work()
        except StorageError:
            time.sleep(0.5)
    return work()


def test_a_result_computed_during_a_database_outage_reaches_the_model_and_the_client(outage_stack) -> None:
    h, pg = outage_stack
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "outage", "scripted:slow_tool")  # debug_sleep 2.5 s
    posted = chat.post_message(h.k, tenant, session.id, "go")
    (tool,) = run_step(h.k, tenant, posted.turn.id, 0).tools
    failure: list[BaseException] = []

    def first_run() -> None:
        try:
            run_tool(h.k, tool.tenant_id, tool.invocation_id, tool.tool, tool.hard_limit)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            failure.append(exc)

    runner = threading.Thread(target=first_run)
    runner.start()
    time.sleep(0.5)
    pg.stop()  # the tool is sleeping; its result will find no database
    runner.join(30)
    assert failure and isinstance(failure[0], StorageError)
    assert spool.get(h.k, tool.invocation_id) is not None  # kept, not thrown away
    pg.start()
    handoff = _retrying(lambda: run_tool(h.k, tool.tenant_id, tool.invocation_id, tool.tool, tool.hard_limit))
    assert [s.step for s in handoff.steps] == [1]  # the last result moved the turn on
    assert spool.get(h.k, tool.invocation_id) is None
    results = [json.loads(e.data) for e in h.events(posted.turn.id) if e.type == "tool_result"]
    assert len(results) == 1 and not results[0]["is_error"] and results[0]["content"]["slept_s"] == 2.5
    assert run_step(h.k, tenant, posted.turn.id, 1) is not None
    turn = chat.get_turn(h.k, tenant, posted.turn.id)
    assert turn.status == "done"
    with h.k.db.connect() as conn:  # what the model read in step 1
        history = chats.load_history(conn, tenant, session.id, limit=50)
    (answer,) = [m for m in history if isinstance(m, ToolMessage)]
    assert not answer.result.is_error and answer.result.content["slept_s"] == 2.5
