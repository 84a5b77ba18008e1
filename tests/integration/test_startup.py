"""Starting Kortex wrong, through the real command line: one line saying what is wrong and what
to do, a failing exit code, no traceback and no password, on the real PostgreSQL."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import PG_ADMIN, REDIS_URL, ROOT, Service, service_env
from tests.integration.redisproc import private_database

pytestmark = pytest.mark.timeout(120)


def kortex(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    clean.update(env or {}, PYTHONPATH=str(ROOT), COLUMNS="60")  # narrow: a wrapped line would show
    return subprocess.run([sys.executable, "-m", "kortex_cli.main", *args], env=clean, cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=90)


def one_line_error(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode not in (0, None), run
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert "Traceback" not in run.stderr and len(lines) == 1, run.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def with_password(url: str, password: str = "hunter2") -> str:
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user.split(':')[0]}:{password}@{host}"


def test_migrate_against_a_database_that_does_not_exist_says_so_without_the_password() -> None:
    url = with_password(PG_ADMIN.rsplit("/", 1)[0] + "/kortex_no_such_database")
    line = one_line_error(kortex("migrate", env={"KORTEX_DATABASE_URL": url}))
    assert "cannot use the database" in line and 'database "kortex_no_such_database" does not exist' in line
    assert "hunter2" not in line


@pytest.mark.parametrize("command", [["api"], ["worker", "--queues", "turns"], ["beat"]])
def test_distributed_processes_refuse_an_unmigrated_database_and_a_missing_url(command: list[str]) -> None:
    with private_database(PG_ADMIN, migrated=False) as url:
        line = one_line_error(kortex(*command, env={"KORTEX_DATABASE_URL": url, "KORTEX_REDIS_URL": REDIS_URL}))
    assert line == "error: the database has no Kortex schema: run 'kortex migrate'"
    line = one_line_error(kortex(*command, env={"KORTEX_REDIS_URL": REDIS_URL}))
    assert "set KORTEX_DATABASE_URL" in line and "SQLite file of its own" in line


def test_a_postgres_url_is_accepted_as_every_postgresql_tool_accepts_it() -> None:
    with private_database(PG_ADMIN, migrated=False) as url:
        postgres = "postgres://" + url.split("://", 1)[1]
        run = kortex("migrate", env={"KORTEX_DATABASE_URL": postgres})
        assert run.returncode == 0 and run.stdout.startswith("database schema created (at "), run.stderr
        again = kortex("migrate", env={"KORTEX_DATABASE_URL": postgres})
        assert again.returncode == 0 and again.stdout.startswith("database is up to date (schema at "), again.stderr
        import psycopg
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone() is not None


def test_migrate_says_from_which_revision_it_moved_a_database_behind() -> None:
    from kortex.storage.migrate import _script, upgrade

    head = _script().get_current_head()
    assert head is not None
    previous = _script().get_revision(head).down_revision
    assert isinstance(previous, str)
    with private_database(PG_ADMIN, migrated=False) as url:
        upgrade(url, previous)
        run = kortex("migrate", env={"KORTEX_DATABASE_URL": url})
    assert run.returncode == 0 and run.stdout.strip() == f"database migrated from {previous} to {head}", run.stderr


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again at once: nothing listens there


@pytest.mark.parametrize(("url", "says"), [
    (None, "cannot reach the Kortex API at http://127.0.0.1:{port}: [Errno 111] Connection refused"),
    ("http://kortex-no-such-host.invalid:8000", "cannot reach the Kortex API at http://kortex-no-such-host.invalid:8000"),
    ("127.0.0.1:8000", "not a usable URL"),
])
def test_ask_against_an_api_it_cannot_reach_is_one_line(url: str | None, says: str) -> None:
    port = _refused_port()
    target = url or f"http://127.0.0.1:{port}"
    line = one_line_error(kortex("ask", "why?", "--url", target, "--api-key", "kx_secretsecret"))
    assert says.format(port=port) in line and "kx_secretsecret" not in line


def test_an_unknown_configuration_key_stops_the_api_with_the_likely_one_named(tmp_path: Path) -> None:
    (tmp_path / "kortex.toml").write_text('databse_url = "postgresql://x@127.0.0.1/x"\n')
    line = one_line_error(kortex("api", cwd=tmp_path))
    assert "unknown key 'databse_url' (did you mean 'database_url'?)" in line


def test_a_database_url_that_is_not_a_url_stops_the_api_in_one_line() -> None:
    line = one_line_error(kortex("api", env={"KORTEX_DATABASE_URL": "db.internal:5432/kortex",
                                             "KORTEX_REDIS_URL": REDIS_URL}))
    # refused as the setting is read, naming it and never echoing the value
    assert line.startswith("error: invalid configuration: database_url:") and "not a URL" in line
    assert "db.internal" not in line


def test_the_api_against_a_database_that_does_not_exist_says_so_in_one_line() -> None:
    url = with_password(PG_ADMIN.rsplit("/", 1)[0] + "/kortex_no_such_database")
    line = one_line_error(kortex("api", env={"KORTEX_DATABASE_URL": url, "KORTEX_REDIS_URL": REDIS_URL}))
    assert "cannot use the database" in line and "does not exist" in line and "hunter2" not in line


def _built_in(output: str) -> list[int]:
    """The processes that logged their container built, in the order they did."""
    return [int(pid) for pid in re.findall(r"kortex container ready in process (\d+)", output)]


def test_a_worker_builds_its_container_as_it_starts_in_each_process_that_runs_tasks(
        worker: Service, pg_url: str, redis_prefix: str, tmp_path: Path) -> None:
    # prefork (the session's worker, -c 4): each child once it is forked (a child replaced after
    # a fault test builds its own too), never the parent, which runs no task
    worker.wait_for(lambda: len(_built_in(worker.output())) >= 4, timeout=30)
    children = _built_in(worker.output())
    assert len(set(children)) == len(children) and worker.proc.pid not in children
    # the threads pool (`kortex worker`'s default): the worker's own process, with no task sent
    # (a private prefix: it must not take the session's messages)
    prefix = f"{redis_prefix}-start"
    env = service_env(pg_url, prefix)
    threads = Service("turns worker", [sys.executable, "-m", "kortex_cli.main", "worker", "--queues", "turns"],
                      env, tmp_path / "worker.log")
    try:
        threads.wait_for(lambda: " ready." in threads.output() and _built_in(threads.output()), timeout=30)
        assert _built_in(threads.output()) == [threads.proc.pid]
    finally:
        threads.stop()
        client = redis.Redis.from_url(REDIS_URL)
        left = list(client.scan_iter(match=f"{prefix}:*"))  # what the worker declared
        if left:
            client.delete(*left)
        client.close()
