"""The command line in the embedded mode: the demo and tenant administration."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kortex_cli.main import app


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "kortex"


def test_demo_streams_an_answer_naming_the_deploy_and_the_pool_errors(home: Path) -> None:
    result = CliRunner().invoke(app, ["demo"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "mode: embedded" in out and (home / "kortex.db").is_file()
    for tool in ("get_recent_deploys", "compare_to_baseline", "get_logs", "get_incident_history", "propose_action"):
        assert f"→ {tool}" in out and f"✓ {tool}" in out
    assert "⚑ proposal" in out and "awaits a human" in out
    assert "Offline analyst (rule-based, no LLM)" in out
    assert "v2.14.0" in out and "connection pool exhausted" in out
    assert out.index("→ get_logs") < out.index("✓ get_logs") < out.index("Summary")
    assert "· done" in out


def test_create_tenant_prints_a_working_key_once(home: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["admin", "create-tenant", "acme"], catch_exceptions=False)
    assert first.exit_code == 0
    key = first.output.strip().splitlines()[-1]
    assert re.fullmatch(r"kx_[0-9a-f]{12}_[A-Za-z0-9]{20,}", key)
    db = (home / "kortex.db").read_bytes()
    assert key.encode() not in db and key.split("_")[2].encode() not in db  # only a hash is stored
    again = runner.invoke(app, ["admin", "create-tenant", "acme"])
    assert again.exit_code == 1 and "already exists" in again.output
    more = runner.invoke(app, ["admin", "create-key", "acme"])  # no --role: the least that can chat
    assert more.exit_code == 0 and more.output.strip() != key
    chat = runner.invoke(app, ["admin", "create-key", "acme", "--role", "operator"])
    assert chat.exit_code == 0
    from sqlalchemy import create_engine, text
    engine = create_engine(f"sqlite:///{home / 'kortex.db'}")
    with engine.connect() as conn:
        roles = conn.execute(text("SELECT key_id, role FROM api_keys")).all()
    engine.dispose()
    assert dict(roles)[chat.output.strip().split("_")[1]] == "operator"
    assert dict(roles)[more.output.strip().split("_")[1]] == "chat"
    assert sorted(r for _, r in roles) == ["admin", "chat", "operator"]  # the tenant's first key: admin
    bad = runner.invoke(app, ["admin", "create-key", "acme", "--role", "root"])
    assert bad.exit_code == 2 and "unknown role" in bad.output  # a usage error


def test_tenants_and_keys_made_with_the_cli_are_audited_without_their_secrets(home: Path) -> None:
    runner = CliRunner()
    made = runner.invoke(app, ["admin", "create-tenant", "acme"], catch_exceptions=False)
    first = made.output.strip().splitlines()[-1]
    more = runner.invoke(app, ["admin", "create-key", "acme", "--role", "ingest"], catch_exceptions=False)
    second = more.output.strip()
    from sqlalchemy import create_engine, text
    engine = create_engine(f"sqlite:///{home / 'kortex.db'}")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT kind, subject, payload FROM decisions ORDER BY created_at")).all()
    engine.dispose()
    assert [(kind, subject) for kind, subject, _ in rows] == [
        ("tenant_created", "acme"), ("key_created", first.split("_")[1]), ("key_created", second.split("_")[1])]
    assert [json.loads(p) for *_, p in rows] == [{"by": "cli"}, {"by": "cli", "role": "admin", "name": "default"},
                                                 {"by": "cli", "role": "ingest", "name": "default"}]
    for key in (first, second):
        assert not any(key.split("_")[2] in str(row) for row in rows)  # no secret in any audit row


def test_worker_refuses_to_start_without_redis(home: Path) -> None:
    result = CliRunner().invoke(app, ["worker"])
    assert result.exit_code == 1 and "KORTEX_REDIS_URL" in result.output


@pytest.fixture
def fake_anthropic(home: Path, monkeypatch: pytest.MonkeyPatch):
    from kortex.testing.fakellm import FakeLLM

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with FakeLLM() as fake:
        monkeypatch.setenv("KORTEX_LLM__PROVIDERS__ANTHROPIC__BASE_URL", fake.url)
        monkeypatch.setenv("KORTEX_LLM__PROVIDERS__ANTHROPIC__API_KEY", "test-key")
        yield fake


def test_ask_with_a_vendor_model_streams_its_answer_and_its_cost(fake_anthropic) -> None:
    fake_anthropic.add("claude-sonnet-4-6", {"steps": [
        {"text": ["Looking at deploys."], "tool_calls": [
            {"name": "get_recent_deploys", "arguments": {"product": "checkout", "time_range": "last 2h"}}]},
        {"text": ["Nothing was deployed; ", "check the database."],
         "usage": {"input_tokens": 1_000_000, "output_tokens": 0}}]})
    result = CliRunner().invoke(app, ["ask", "why is checkout slow?", "--model", "anthropic:claude-sonnet-4-6"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "anthropic:claude-sonnet-4-6" in out and "→ get_recent_deploys" in out and "✓ get_recent_deploys" in out
    assert "Nothing was deployed; check the database." in out and "· done" in out
    assert "$3.00" in out  # a million input tokens at Sonnet's price, plus the first step's few
    assert fake_anthropic.requests[0].headers["x-api-key"] == "test-key"


def test_ask_with_an_unconfigured_vendor_says_what_is_missing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = CliRunner().invoke(app, ["ask", "why?", "--model", "openai:gpt-4o"])
    assert result.exit_code == 1 and "OPENAI_API_KEY" in result.output


def test_models_lists_catalogue_prices_and_why_a_provider_is_unavailable(fake_anthropic) -> None:
    result = CliRunner().invoke(app, ["models"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "anthropic:claude-opus-4-6" in result.output and "1,000,000" in result.output
    assert "openai: unavailable" in result.output and "test-key" not in result.output


def test_demo_exits_non_zero_when_its_turn_fails(fake_anthropic) -> None:
    fake_anthropic.add("claude-sonnet-4-6", {"steps": [{"faults": [{"status": 400}], "text": ["never sent"]}]})
    result = CliRunner().invoke(app, ["demo", "--model", "anthropic:claude-sonnet-4-6"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert "never sent" not in result.output


@pytest.mark.parametrize(("env", "args", "processes"), [
    ({}, [], 1),  # embedded: one process owns the SQLite file and the in-process worker
    ({"KORTEX_REDIS_URL": "redis://127.0.0.1:6379/0", "KORTEX_DATABASE_URL": "postgresql://x@127.0.0.1/x"}, [], 2),
    ({"KORTEX_REDIS_URL": "redis://127.0.0.1:6379/0", "KORTEX_DATABASE_URL": "postgresql://x@127.0.0.1/x"},
     ["--workers", "3"], 3),
])
def test_api_runs_two_processes_by_default_in_the_distributed_mode(
        home: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], args: list[str], processes: int) -> None:
    from kortex.storage import migrate
    from kortex_cli import main
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(migrate, "require_schema", lambda url: None)  # its own tests: tests/integration/test_startup.py
    # Two API processes share a metrics directory the command names in the environment: keep it
    # out of this test process's (monkeypatch restores what it first records).
    monkeypatch.setenv("KORTEX_METRICS_DIR", str(home))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    ran: list[Any] = []
    monkeypatch.setattr(main, "_serve", ran.append)
    result = CliRunner().invoke(app, ["api", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert ran[0].app == "api.main:create_app" and ran[0].workers == processes


def test_api_refuses_more_processes_in_the_embedded_mode_and_less_than_one(home: Path) -> None:
    runner = CliRunner()
    many = runner.invoke(app, ["api", "--workers", "2"])
    assert many.exit_code == 2 and "embedded mode runs in one process" in many.output  # a usage error
    none = runner.invoke(app, ["api", "--workers", "0"])
    assert none.exit_code == 2 and "--workers" in none.output


def test_the_api_keeps_an_idle_connection_open_longer_than_clients_reuse_one(tmp_path: Path) -> None:
    """A client (aiohttp keeps idle connections 15 s; proxies 60 s) sends its next request on a
    connection that sat idle: the server must not have closed it meanwhile, or that request
    fails with "connection reset". uvicorn's own default closes after 5 s."""
    import os
    import subprocess
    import sys
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env.update(KORTEX_HOME=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    api = subprocess.Popen([sys.executable, "-m", "kortex_cli.main", "api", "--port", str(port)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                assert api.poll() is None and time.monotonic() < deadline, "the API did not start"
                time.sleep(0.2)
        with conn:
            conn.sendall(request)
            assert _response(conn).startswith(b"HTTP/1.1 200")
            time.sleep(6.5)  # past uvicorn's default keep-alive of 5 s
            conn.sendall(request)
            assert _response(conn).startswith(b"HTTP/1.1 200")  # b"" had the server closed it
    finally:
        api.terminate()
        api.wait(30)


def _response(conn: socket.socket) -> bytes:
    """One whole HTTP response (head and Content-Length body), however the segments arrive;
    b"" when the server closed the connection instead."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("args, sentence", [
    ([], "Run the watchdog process: fails expired turns and re-enqueues lost work. Safe to run more than one: "
         "one leads at a time, another takes over when it dies."),
    (["worker"], "One process per core: a turns worker streams up to turn.max_inflight_steps LLM steps at once "
                 "on its event loop whatever its slots, so its slots only hand steps over; a tools worker runs one "
                 "tool call per slot."),
])
def test_help_rewraps_a_docstring_to_the_terminal_instead_of_keeping_its_line_breaks(
        args: list[str], sentence: str) -> None:
    # Wide enough that only the docstring's own line breaks could split the sentence.
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "400"}, catch_exceptions=False)
    assert result.exit_code == 0
    assert any(sentence in line for line in result.output.splitlines()), result.output
