"""What the terminal shows of a routed turn: the routing decision, an anomaly and the recovery
that ran (a retried answer is announced, not run on as if one answer), and the model that
actually answered; and ``--model auto`` is a model the CLI takes, as the API does."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kortex.testing.fakellm import FakeLLM
from kortex_cli.main import app
from kortex_cli.render import EventPrinter
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

FAST, BALANCED = "claude-haiku-4-6", "claude-sonnet-4-6"


def test_a_retried_answer_is_announced_and_the_model_that_answered_is_named(harness_factory: Any) -> None:
    with FakeLLM() as fake:
        fake.add(FAST, {"steps": [{"text": ["Yes, up."]}]})  # too short: asked again, on the fallback
        fake.add(BALANCED, {"steps": [{"text": ["Checkout is up: every check passed this hour."]}]})
        h: Harness = harness_factory(llm={
            "providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)},
            "default_provider": "anthropic",
            "routing": {"candidates": [f"anthropic::{FAST}", f"anthropic::{BALANCED}"]}})
        turn = h.ask(h.tenant("acme"), "Is checkout up?", model="auto")
    out = io.StringIO()
    printer = EventPrinter(Console(file=out, width=200, force_terminal=False))
    for event in h.events(turn.id):
        printer.show(event.type, json.loads(event.data))
    lines = out.getvalue().splitlines()
    assert any(line.startswith(f"· routed to anthropic:{FAST} (fast") for line in lines), lines
    retry = next(i for i, line in enumerate(lines) if line.startswith(f"↻ retry on anthropic:{BALANCED}"))
    # Between the two answers: what was found, and that a new answer follows.
    assert lines[retry - 2:retry] == ["Yes, up.", "! short_answer (medium): the answer has 8 characters "
                                                  "(fewer than 20)"], lines
    assert lines[retry + 1].startswith("Checkout is up"), lines
    assert f"· done · anthropic:{BALANCED} ·" in lines[-1], lines


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KORTEX_HOME", str(tmp_path / "kortex"))
    return tmp_path / "kortex"


def test_ask_takes_model_auto(home: Path) -> None:
    result = CliRunner().invoke(app, ["ask", "Is checkout up?", "--model", "auto"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "· routed to offline:" in result.stdout  # nothing else is configured: the offline analyst


def test_ask_with_model_auto_and_nothing_to_route_to_is_refused_before_starting(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KORTEX_LLM__ROUTING__CANDIDATES", '["openai::gpt-4o"]')  # OpenAI has no key here
    result = CliRunner().invoke(app, ["ask", "Is checkout up?", "--model", "auto"])
    assert result.exit_code == 1 and "routing found no available model" in result.stderr, result.output
    assert not (home / "kortex.db").exists()


def test_control_characters_from_the_server_never_reach_the_terminal() -> None:
    """A model quoting an ingested log line, a tool's error, an incident's title: text from
    people other than the reader. Its escape sequences (clear the screen, retitle the window)
    reached the terminal as they were."""
    from rich.table import Table

    from kortex_cli.render import make_console

    console = make_console()
    console.file = out = io.StringIO()
    printer = EventPrinter(console)
    printer.show("turn", {"type": "turn", "step": 0, "attempt": 1, "seq": 1})
    printer.show("text", {"type": "text", "delta": "the log says \x1b[2J\x1b]0;owned\x07 here", "attempt": 1, "seq": 2})
    printer.show("tool_result", {"type": "tool_result", "name": "get_logs", "is_error": True, "error_code": "upstream",
                                 "content": {"message": "bad \x9b31m line\r"}, "attempt": 1, "seq": 3})
    table = Table(title="incident \x1b[5m")
    table.add_column("title")
    table.add_row("db \x1b[8mhidden")
    console.print(table)
    shown = out.getvalue()
    assert not any(ch in shown for ch in "\x1b\x07\x9b\r"), repr(shown)
    assert "the log says \ufffd[2J\ufffd]0;owned\ufffd here" in shown
    assert "db \ufffd[8mhidden" in shown and "bad \ufffd31m line" in shown


def test_a_tool_name_is_printed_as_written_not_as_markup() -> None:
    # The name rides on the event as the model wrote it; rich read "[red]" in it as a style.
    out = io.StringIO()
    printer = EventPrinter(Console(file=out, width=200, force_terminal=False))
    name = "get_logs[red][/red]"
    printer.show("tool_call", {"name": name, "arguments": {}, "call_id": "c1"})
    printer.show("tool_result", {"name": name, "is_error": True, "error_code": "unknown_tool",
                                 "content": {"message": "no such tool"}})
    assert out.getvalue().count(name) == 2, out.getvalue()
