"""What the commands refuse, as the real command line says it: a usage error exits 2 with one
line on stderr; a port, file, Redis or database a process cannot use exits 1 with one line
naming it (never a password, never a traceback), before anything starts. And output that is
not a terminal keeps its lines whole."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine

REPO = Path(__file__).resolve().parents[2]
#: Nothing listens there: a check that reached for it first would fail on it, not on the option.
NOWHERE = {"KORTEX_REDIS_URL": "redis://127.0.0.1:9/0", "KORTEX_DATABASE_URL": "postgresql://x@127.0.0.1:9/x"}


def kortex(home: Path, *args: str, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, its output a pipe. A process that starts instead of refusing
    is killed at ``timeout`` (subprocess.run does) and the test fails."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("KORTEX_") and k not in ("COLUMNS", "FORCE_TERMINAL", "TTY_COMPATIBLE")}
    clean.update(HOME=str(home), KORTEX_HOME=str(home / "kortex"), PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "kortex_cli.main", *args], env=clean, cwd=home,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_piped_output_is_not_wrapped_at_80_columns(tmp_path: Path) -> None:
    from kortex.telemetry.scenarios import SCENARIOS

    listing = kortex(tmp_path, "seed", "--list")
    assert listing.returncode == 0, listing.stderr
    for item in SCENARIOS.values():
        assert f"{item.name}: {item.title}" in listing.stdout.splitlines(), listing.stdout

    models = kortex(tmp_path, "models")
    assert models.returncode == 0, models.stderr
    assert ("anthropic: unavailable (no API key: set ANTHROPIC_API_KEY or llm.providers.anthropic.api_key)"
            in models.stdout.splitlines()), models.stdout

    # A tool call as `kortex ask ... > file` prints it: the command's own console, its arguments
    # and its id on one line.
    query = '|~ "(?i)(feature flag|migration|config(uration)? (change|reload)|rolled (out|back)|failover)"'
    script = ("from kortex_cli.main import console\nfrom kortex_cli.render import EventPrinter\n"
              "EventPrinter(console).show('tool_call', {'name': 'get_logs', 'call_id': 'call_b67c9f078d296d19', "
              f"'arguments': {{'product': 'checkout', 'time_range': 'last 3h', 'query': {query!r}}}}})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_TERMINAL", "TTY_COMPATIBLE")}
    printed = subprocess.run([sys.executable, "-c", script], env={**env, "PYTHONPATH": str(REPO)},
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("→ get_logs(") and lines[0].endswith(" call_b67c9f078d296d19")
    assert query.replace('"', '\\"') in lines[0]


@pytest.mark.parametrize(("args", "names"), [
    (["models", "--url", "http://127.0.0.1:9"], "--api-key"),
    (["admin", "create-key", "acme", "--role", "bogus"], "unknown role 'bogus'"),
    (["api", "--port", "99999"], "'--port'"),
    (["api", "--port", "0"], "'--port'"),
    (["worker", "--queues", ""], "--queues"),
    (["worker", "--queues", " , "], "--queues"),
    (["worker", "--queues", "turns,nope"], "'nope'"),
    (["worker", "--concurrency", "0"], "'--concurrency'"),
    (["worker", "--loglevel", "LOUD"], "'--loglevel'"),
    (["worker", "--pool", "gevent"], "'--pool'"),
    (["worker", "--max-tasks-per-child", "5"], "--pool prefork"),
    (["beat", "--loglevel", "LOUD"], "'--loglevel'"),
    (["beat", "--alive-file", "{home}/missing/dir/alive"], "--alive-file"),
    (["beat", "--alive-file", "{home}"], "--alive-file"),  # a directory
])
def test_a_usage_error_exits_2_with_its_message_on_stderr(tmp_path: Path, args: list[str], names: str) -> None:
    # With NOWHERE a check that reached for the database or Redis before the options would fail there.
    result = kortex(tmp_path, *[a.format(home=tmp_path) for a in args], env=NOWHERE, timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == "" and names in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_worker_concurrency_past_its_bound_is_a_usage_error_that_says_why(tmp_path: Path) -> None:
    # A typo (16000 for 16) would start 16,000 threads or prefork children.
    result = kortex(tmp_path, "worker", "--concurrency", "16000", env=NOWHERE, timeout=30)
    assert result.returncode == 2, result.stderr
    line = one_line_error(result)
    assert line.startswith("error: --concurrency 16000: at most 256 slots per worker")
    assert "one process per core" in line and "start more workers" in line
    # The bound itself is taken: the command goes on to the database, which is NOWHERE.
    at_bound = kortex(tmp_path, "worker", "--concurrency", "256", env=NOWHERE, timeout=30)
    assert at_bound.returncode == 1 and "--concurrency" not in at_bound.stderr, at_bound.stderr


def test_the_log_levels_are_accepted_in_any_case(tmp_path: Path) -> None:
    # Past the option, the command goes on to its next check (KORTEX_REDIS_URL unset).
    result = kortex(tmp_path, "beat", "--loglevel", "debug", timeout=30)
    assert result.returncode == 1 and "KORTEX_REDIS_URL" in one_line_error(result)


def test_an_alive_file_that_can_be_written_is_not_touched_before_beat_sweeps(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    result = kortex(tmp_path, "beat", "--alive-file", str(alive), timeout=30)  # then: no KORTEX_REDIS_URL
    assert result.returncode == 1 and "KORTEX_REDIS_URL" in one_line_error(result)
    assert not alive.exists()  # its age says beat swept; a check must not create it
    alive.touch()
    os.utime(alive, (1_000_000, 1_000_000))
    kortex(tmp_path, "beat", "--alive-file", str(alive), timeout=30)
    assert alive.stat().st_mtime == 1_000_000


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.mark.parametrize("command", ["worker", "beat"])
def test_a_metrics_port_in_use_stops_the_process_before_it_starts(
        tmp_path: Path, held_port: int, command: str) -> None:
    result = kortex(tmp_path, command, "--metrics-port", str(held_port), env=NOWHERE, timeout=30)
    assert result.returncode == 1
    line = one_line_error(result)
    assert f"--metrics-port {held_port}" in line and "in use" in line


def test_a_celery_started_worker_exits_when_it_cannot_serve_its_metrics(tmp_path: Path, held_port: int) -> None:
    """``celery -A workers.app worker`` with KORTEX_METRICS_PORT: no CLI check runs before it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env.update(HOME=str(tmp_path), KORTEX_HOME=str(tmp_path / "kortex"), PYTHONPATH=str(REPO),
               KORTEX_METRICS_PORT=str(held_port), KORTEX_METRICS_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-P", "solo",
                             "-Q", "turns", "-n", f"metrics-test-{os.getpid()}@%h"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"--metrics-port (KORTEX_METRICS_PORT) {held_port}: Address already in use" in result.stderr


@pytest.fixture
def migrated_sqlite(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "shared.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.mark.parametrize(("args", "what"), [(["beat"], "beat"), (["worker"], "a worker"),
                                            (["api", "--port", "{port}"], "the API")])
def test_an_unreachable_redis_stops_the_process_before_it_starts(
        tmp_path: Path, migrated_sqlite: str, args: list[str], what: str) -> None:
    redis_port = free_port()
    env = {"KORTEX_DATABASE_URL": migrated_sqlite,  # usable: only Redis is not
           "KORTEX_REDIS_URL": f"redis://:s3cret-pw@127.0.0.1:{redis_port}/0"}
    result = kortex(tmp_path, *[a.format(port=free_port()) for a in args], env=env, timeout=30)
    assert result.returncode == 1
    line = one_line_error(result)
    assert f"Redis at 127.0.0.1:{redis_port}" in line and f"which {what} needs" in line
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_a_database_a_newer_kortex_migrated_says_upgrade_kortex(tmp_path: Path, migrated_sqlite: str) -> None:
    engine = create_engine(migrated_sqlite)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    engine.dispose()
    for args in (["migrate"], ["admin", "list-keys", "acme"]):
        result = kortex(tmp_path, *args, env={"KORTEX_DATABASE_URL": migrated_sqlite})
        assert result.returncode == 1
        line = one_line_error(result)
        assert "9999" in line and "upgrade Kortex" in line and "unexpected" not in line


def test_a_file_that_is_not_a_database_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "garbage-file").write_text("garbage " * 200)
    for args in (["migrate"], ["admin", "list-keys", "acme"]):
        result = kortex(tmp_path, *args, env={"KORTEX_DATABASE_URL": "sqlite:///garbage-file"})
        assert result.returncode == 1
        line = one_line_error(result)
        assert "file is not a database" in line and "KORTEX_DATABASE_URL" in line and "unexpected" not in line


def test_a_bad_connection_option_says_the_url_is_wrong_not_to_migrate(tmp_path: Path) -> None:
    url = "postgresql://x@127.0.0.1:9/x?connect_timeout=abc"  # refused before any connection is tried
    for args in (["migrate"], ["admin", "list-keys", "acme"]):
        result = kortex(tmp_path, *args, env={"KORTEX_DATABASE_URL": url})
        assert result.returncode == 1
        line = one_line_error(result)
        assert "connect_timeout" in line and "KORTEX_DATABASE_URL" in line and "migrate" not in line


@pytest.fixture
def empty_postgres() -> Iterator[str]:
    """A PostgreSQL database of its own, with no schema, dropped afterwards."""
    from kortex.testing.scratch import throwaway_database

    admin_url = os.environ.get("KORTEX_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
    with throwaway_database(admin_url, prefix="kortex_cli") as (url, _name):
        yield url


def test_a_shared_database_is_migrated_by_kortex_migrate_only(tmp_path: Path, empty_postgres: str) -> None:
    # An admin command from a newer release must not move a fleet's schema under it: it says
    # what to run instead, and leaves the database as it found it.
    env = {"KORTEX_DATABASE_URL": empty_postgres}
    refused = kortex(tmp_path, "admin", "create-tenant", "acme", env=env)
    assert refused.returncode == 1 and "run 'kortex migrate'" in one_line_error(refused)
    engine = create_engine(empty_postgres.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        tables = conn.exec_driver_sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").scalar()
    engine.dispose()
    assert tables == 0
    assert kortex(tmp_path, "migrate", env=env).returncode == 0
    made = kortex(tmp_path, "admin", "create-tenant", "acme", env=env)
    assert made.returncode == 0 and "kx_" in made.stdout


UNSCOPED_PROMETHEUS = '[telemetry]\nmetrics = "prometheus"\n[telemetry.prometheus]\nurl = "http://127.0.0.1:9"\n'


@pytest.mark.parametrize("args", [["api", "--port", "{port}"], ["api", "--port", "{port}", "--workers", "1"],
                                  ["worker"]])
def test_a_configuration_the_container_refuses_stops_the_process_in_one_line(
        tmp_path: Path, args: list[str]) -> None:
    # The worker's check comes before Redis (NOWHERE): nothing is reached for a configuration error.
    (tmp_path / "kortex.toml").write_text(UNSCOPED_PROMETHEUS)
    env = NOWHERE if args == ["worker"] else None
    result = kortex(tmp_path, *[a.format(port=free_port()) for a in args], env=env, timeout=30)
    assert result.returncode == 1, result.stderr
    assert "every tenant could read every other tenant's metrics" in one_line_error(result)


def test_an_invalid_log_level_variable_is_one_line_for_every_command(tmp_path: Path) -> None:
    result = kortex(tmp_path, "seed", "--list", env={"KORTEX_LOG_LEVEL": "VERBOSE"}, timeout=30)
    assert result.returncode == 1
    line = one_line_error(result)
    assert "KORTEX_LOG_LEVEL" in line and "debug, info, warning, error, critical" in line
    assert kortex(tmp_path, "seed", "--list", env={"KORTEX_LOG_LEVEL": "error"}, timeout=30).returncode == 0


def test_a_misspelt_variable_stops_the_api_instead_of_running_it_embedded(tmp_path: Path) -> None:
    result = kortex(tmp_path, "api", "--port", str(free_port()),
                    env={"KORTEX_REDIS_ULR": "redis://:s3cret-pw@127.0.0.1:9/0",
                         "KORTEX_DATABASE_URL": NOWHERE["KORTEX_DATABASE_URL"]}, timeout=30)
    assert result.returncode == 1
    assert "KORTEX_REDIS_ULR is not a setting (did you mean 'KORTEX_REDIS_URL'?)" in one_line_error(result)
    assert "s3cret-pw" not in result.stderr


def test_several_api_processes_in_the_embedded_mode_is_a_usage_error(tmp_path: Path) -> None:
    result = kortex(tmp_path, "api", "--port", str(free_port()), "--workers", "2", timeout=30)
    assert result.returncode == 2
    assert "--workers 1" in one_line_error(result)


def test_api_processes_that_never_served_make_the_api_exit_non_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn's supervisor stops when its processes fail at startup and returns as from a
    clean stop; the command must not exit 0 then."""
    import uvicorn.supervisors
    from typer.testing import CliRunner
    from uvicorn.config import STARTUP_FAILURE

    from kortex_cli import main

    class Failed:
        exitcode = STARTUP_FAILURE

    class Supervisor:
        def __init__(self, config: object, sockets: list[socket.socket]) -> None:
            for sock in sockets:
                sock.close()
            self.processes = [Failed(), Failed()]

        def run(self) -> None:
            pass

    monkeypatch.setattr(uvicorn.supervisors, "Multiprocess", Supervisor)
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: None)  # what uvicorn.run did then: return
    monkeypatch.setattr(main, "_preflight", lambda settings, what, **counted: None)
    monkeypatch.setattr(main, "_metrics_multiprocess", lambda service: None)
    monkeypatch.setenv("KORTEX_REDIS_URL", "redis://127.0.0.1:9/0")
    monkeypatch.setenv("KORTEX_DATABASE_URL", f"sqlite:///{tmp_path / 'k.db'}")
    result = CliRunner().invoke(main.app, ["api", "--port", str(free_port()), "--workers", "2"])
    assert result.exit_code == 1, result.output
    assert "the API did not start" in result.output
