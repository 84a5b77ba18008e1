"""`kortex ask` and `kortex demo` in the embedded mode: the session a question goes to, what a
refused question leaves behind (nothing), and what stopping the command does to its turn (it
is cancelled, not left for a worker to finish unseen)."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kortex_cli.main import app

ROOT = Path(__file__).resolve().parents[2]
#: Ten chunks a second apart: a turn still streaming whenever the test stops the command.
SLOW = {"steps": [{"text": [f"word{i} " for i in range(10)], "delay_ms": 1000}]}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KORTEX_HOME", str(tmp_path / "kortex"))
    return tmp_path / "kortex"


def rows(home: Path, query: str) -> list[tuple[object, ...]]:
    if not (home / "kortex.db").exists():
        return []
    with sqlite3.connect(home / "kortex.db") as conn:
        return conn.execute(query).fetchall()


def session_line(output: str) -> tuple[str, str]:
    line = next(x for x in output.splitlines() if x.startswith("· session "))
    words = line.split()
    return words[2], words[5]  # "· session <id> · turn <id>"


def test_ask_prints_its_session_and_continues_one_given_with_session(home: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["ask", "why is checkout slow?"], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    session_id, turn_id = session_line(first.stdout)
    again = runner.invoke(app, ["ask", "and payments?", "--session", session_id, "--json"], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    done = [e["data"] for e in map(json.loads, again.stdout.splitlines()) if e["event"] == "done"]
    assert done[0]["status"] == "done" and done[0]["session_id"] == session_id and done[0]["turn_id"] != turn_id
    assert rows(home, "SELECT session_id, count(*) FROM turns GROUP BY session_id") == [(session_id, 2)]


def test_a_question_of_several_lines_names_its_session_on_one_line(home: Path) -> None:
    # The session's name is the question's start, and a name is one line: before the CLI made
    # it one, a line break in those 80 characters would have been a refused name.
    result = CliRunner().invoke(app, ["ask", "why is\n\tcheckout slow?"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert rows(home, "SELECT name FROM chat_sessions") == [("why is checkout slow?",)]


@pytest.mark.parametrize("session", ["does-not-exist", "01a21d08-440c-71d8-83f6-aabc15a0a139"])
def test_ask_with_an_unknown_session_says_so_and_starts_none(home: Path, session: str) -> None:
    result = CliRunner().invoke(app, ["ask", "hi", "--session", session])
    assert result.exit_code == 1
    assert f"no session '{session}'" in result.stderr and result.stdout == ""
    assert rows(home, "SELECT id FROM chat_sessions") == []


@pytest.mark.parametrize("args", [["ask", ""], ["ask", "   "], ["demo", "--question", "   "]])
def test_an_empty_question_is_refused_before_anything_is_made(home: Path, args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "empty" in result.stderr, result.output
    assert not (home / "kortex.db").exists()  # no session, and the demo seeded nothing either


def test_a_question_the_turn_refuses_leaves_no_session_behind(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KORTEX_TURN__MAX_MESSAGE_CHARS", "100")
    result = CliRunner().invoke(app, ["ask", "why? " * 30])
    assert result.exit_code == 1 and "longer than 100 characters" in result.stderr, result.output
    assert rows(home, "SELECT id FROM chat_sessions") == []


def test_demo_checks_its_model_before_seeding(home: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--model", "bogus"])
    assert result.exit_code == 1 and "unknown model 'bogus'" in result.stderr, result.output
    assert "seeded" not in result.output
    assert not (home / "kortex.db").exists()  # nothing was made, let alone the demo's telemetry replaced


# --- stopping the command mid-turn: real processes, real signals and pipes ---------------------

def cli_env(home: Path, scripts: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env.update(KORTEX_HOME=str(home), PYTHONPATH=str(ROOT), KORTEX_TESTING__ENABLE_TEST_PROVIDERS="true",
               KORTEX_TESTING__SCRIPTS_DIR=str(scripts))
    return env


@pytest.fixture
def slow_script(tmp_path: Path) -> Path:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "slow.json").write_text(json.dumps(SLOW))
    return scripts


def read_until(proc: subprocess.Popen[bytes], wanted: str, timeout: float = 60) -> list[str]:
    """Lines of the command's stdout up to the first that contains ``wanted``."""
    assert proc.stdout is not None
    lines: list[str] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no {wanted!r} within {timeout}s: {lines}"
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, f"the command ended before {wanted!r}: {lines}"
        buffer += chunk
        *done, buffer = buffer.split(b"\n")
        lines += [line.decode() for line in done]
        if any(wanted in line for line in lines) or wanted.encode() in buffer:
            return lines + [buffer.decode()]


def interruptible() -> None:
    """``preexec_fn`` of a command a test will Ctrl-C: a suite started in the background of a
    non-interactive shell inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt, as a command started that way should not: the test would see the turn run
    to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_after(proc: subprocess.Popen[bytes], wanted: str) -> tuple[list[str], bytes]:
    """Ctrl-C once ``wanted`` is out; the lines read until then and what the process wrote to
    stderr. A process that does not end is killed, so no test leaves one behind."""
    try:
        lines = read_until(proc, wanted)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return lines, stderr


def turn_status(home: Path, turn_id: str) -> str:
    found = rows(home, f"SELECT status FROM turns WHERE id = '{turn_id}'")
    return str(found[0][0])


@pytest.mark.parametrize("as_json", [True, False])
def test_ctrl_c_cancels_the_turn_and_exits_130(tmp_path: Path, slow_script: Path, as_json: bool) -> None:
    home = tmp_path / "kortex"
    args = [sys.executable, "-m", "kortex_cli.main", "ask", "hi", "--model", "scripted:slow"]
    proc = subprocess.Popen(args + (["--json"] if as_json else []), env=cli_env(home, slow_script),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interruptible)
    lines, stderr = interrupt_after(proc, "word0")  # the turn is streaming
    if as_json:
        turn_id = json.loads(lines[0])["data"]["turn_id"]
    else:
        turn_id = session_line("\n".join(lines))[1]
    assert turn_status(home, turn_id) == "cancelled", stderr.decode()  # not left for a worker to finish
    assert proc.returncode == 130
    assert f"cancelled turn {turn_id} (interrupted)" in stderr.decode()
    assert "Traceback" not in stderr.decode()


@pytest.mark.parametrize("as_json", [True, False])
def test_a_closed_output_cancels_the_turn_quietly(tmp_path: Path, slow_script: Path, as_json: bool) -> None:
    """``kortex ask ... | head -1``: head exits after one line, and the next write fails."""
    home = tmp_path / "kortex"
    args = [sys.executable, "-m", "kortex_cli.main", "ask", "hi", "--model", "scripted:slow"]
    proc = subprocess.Popen(args + (["--json"] if as_json else []), env=cli_env(home, slow_script),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = read_until(proc, '"turn"' if as_json else "session")[0]
        assert proc.stdout is not None
        proc.stdout.close()  # as head does once it has its line
        stderr = proc.stderr.read() if proc.stderr is not None else b""
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    turn_id = json.loads(first)["data"]["turn_id"] if as_json else session_line(first)[1]
    assert turn_status(home, turn_id) == "cancelled", stderr.decode()
    assert proc.returncode == 141
    assert f"cancelled turn {turn_id} (its output was closed)" in stderr.decode()
    assert "Traceback" not in stderr.decode() and "BrokenPipeError" not in stderr.decode()


# --- Ctrl-C before the turn streams: the command waits at a gate (tests/kortex_cli/gated_cli.py) --

def gated(home: Path, scripts: Path, gate: str, when: str, *args: str, nth: int = 1) -> subprocess.Popen[bytes]:
    """The command, to wait at ``gate`` (its ``nth`` call) until its stdin is closed."""
    return subprocess.Popen([sys.executable, "-m", "tests.kortex_cli.gated_cli", gate, when, str(nth), "--", *args],
                            env=cli_env(home, scripts), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=interruptible)


def at_gate(proc: subprocess.Popen[bytes], timeout: float = 60) -> bytes:
    """What the command wrote on stderr up to the line saying it waits at its gate."""
    assert proc.stderr is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while b"gate: " not in seen:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"the command did not reach its gate within {timeout}s: {seen.decode()}"
        chunk = os.read(proc.stderr.fileno(), 65536)
        assert chunk, f"the command ended before its gate: {seen.decode()}"
        seen += chunk
    return seen


def finish(proc: subprocess.Popen[bytes], stderr: bytes) -> str:
    """Let the command past its gate (stdin closes) and wait for it; all it wrote on stderr,
    without the gate's own line."""
    try:
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return "\n".join(line for line in (stderr + rest).decode().splitlines() if not line.startswith("gate: "))


def assert_quiet_130(proc: subprocess.Popen[bytes], stderr: str) -> None:
    assert proc.returncode == 130, stderr
    assert "Aborted" not in stderr and "Traceback" not in stderr, stderr


@pytest.mark.parametrize(("gate", "when"), [
    ("alembic.runtime.migration:HeadMaintainer.update_to_step", "after"),  # the SQLite file half migrated
    ("workers.embedded:EmbeddedWorker.start", "after"),
    ("kortex_cli.runner:_tenant_id", "before"),
])
def test_ctrl_c_while_the_embedded_mode_starts_exits_130_and_leaves_a_usable_database(
        tmp_path: Path, slow_script: Path, gate: str, when: str) -> None:
    home = tmp_path / "kortex"
    proc, stderr = gated(home, slow_script, gate, when, "ask", "hi"), b""
    try:
        stderr = at_gate(proc)
        proc.send_signal(signal.SIGINT)
    finally:
        said = finish(proc, stderr)
    again = subprocess.run([sys.executable, "-m", "kortex_cli.main", "ask", "hi"], env=cli_env(home, slow_script),
                           capture_output=True, timeout=120)
    assert again.returncode == 0, again.stderr.decode()  # the database took no harm
    assert rows(home, "SELECT count(*) FROM turns") == [(1,)]  # the interrupted command asked nothing
    assert_quiet_130(proc, said)
    assert said == "stopped before the question was asked (interrupted)"


def test_ctrl_c_as_the_question_is_stored_cancels_the_turn_it_made(tmp_path: Path, slow_script: Path) -> None:
    """The interrupt lands once the turn is committed, before the command has its id: left
    queued, a later run's watchdog would start it, unseen and billed."""
    home = tmp_path / "kortex"
    proc = gated(home, slow_script, "kortex.turns.chat:start_session", "after", "ask", "hi", "--model",
                 "scripted:slow")
    stderr = b""
    try:
        stderr = at_gate(proc)
        proc.send_signal(signal.SIGINT)
    finally:
        said = finish(proc, stderr)
    [(turn_id, status)] = rows(home, "SELECT id, status FROM turns")
    assert status == "cancelled", said
    assert_quiet_130(proc, said)
    assert said == f"cancelled turn {turn_id} (interrupted)"


def test_a_second_ctrl_c_while_the_command_stops_is_ignored(tmp_path: Path, slow_script: Path) -> None:
    """The second lands as the embedded worker is stopped, after the turn was cancelled."""
    home = tmp_path / "kortex"
    proc = gated(home, slow_script, "workers.embedded:EmbeddedWorker.stop", "before", "ask", "hi", "--model",
                 "scripted:slow", "--json")
    stderr = b""
    try:
        turn_id = json.loads(read_until(proc, "word0")[0])["data"]["turn_id"]
        proc.send_signal(signal.SIGINT)
        stderr = at_gate(proc)
        proc.send_signal(signal.SIGINT)
    finally:
        said = finish(proc, stderr)
    assert turn_status(home, turn_id) == "cancelled"
    assert_quiet_130(proc, said)
    # The report outlives the second Ctrl-C. (The worker may log its step's stop before it.)
    assert said.splitlines()[-1] == f"cancelled turn {turn_id} (interrupted)"
