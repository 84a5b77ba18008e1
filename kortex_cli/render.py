"""Print turn events to a terminal as they stream."""

from __future__ import annotations

import json
import re
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from kortex.llm.base import WARNING_CODES
from kortex_cli.attempts import AttemptFilter


#: What a terminal would act on rather than show: C0 controls but tab and newline, DEL, C1.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character shown as U+FFFD. What the CLI prints comes from
    the server, and much of it from people other than the reader: a model quoting an ingested
    log line, an incident's title, a session's name. An escape sequence in any of them (ESC [2J
    clears the screen; others retitle the window or rewrite lines already printed) reached the
    operator's terminal as it was: rich drops a few controls, ESC not among them."""
    return _CONTROL.sub("\ufffd", text) if not text.isprintable() else text


class _SafeConsole(Console):
    """Every string printed, table cells and titles too, goes through ``render_str``: made safe
    there, before markup is read, so no print can forget it (this module's markup has no
    control characters)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(terminal_safe(text), **kwargs)


def make_console(stderr: bool = False) -> Console:
    """Rich wraps at the terminal's width, and at 80 columns when the output is a pipe or a file:
    there a tool call's id, a LogQL query or a rationale split over two lines cannot be read back
    or copied, so lines are left whole (soft wrap) unless a terminal shows them."""
    console = _SafeConsole(stderr=stderr, highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def _args(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items())


class EventPrinter:
    def __init__(self, console: Console, *, as_json: bool = False) -> None:
        self.console = console
        self.as_json = as_json
        self._in_text = False
        self._attempts = AttemptFilter()
        # The model answering now: a step's turn event names the first it tries, a recovery the
        # one that took over (a retried or too slow answer), so the closing line names the right one.
        self._model: str | None = None

    def _end_text(self) -> None:
        if self._in_text:
            self.console.print()
            self._in_text = False

    def show(self, event: str, data: dict[str, Any]) -> None:
        if not self._attempts.accept(event, data):
            return  # a superseded attempt's late event
        if self.as_json:
            print(json.dumps({"event": event, "data": data}), flush=True)
            return
        c = self.console
        if event == "text":
            c.print(escape(data.get("delta", "")), end="", soft_wrap=True)
            c.file.flush()
            self._in_text = True
            return
        self._end_text()
        if event == "turn" and self._attempts.rerun_step is not None:
            # What was printed of this step cannot be taken back: say the step starts over.
            self.console.print(f"[yellow]! step {self._attempts.rerun_step} is starting again "
                               "(its worker stopped); its answer follows anew[/yellow]")
        elif event == "turn":
            self._model = data.get("model") or self._model
            if data.get("step"):
                c.print(f"[dim]· step {data['step']} ({data.get('model') or 'model'})[/dim]")
            else:
                c.print(f"[dim]· thinking with {data.get('model') or 'the default model'}[/dim]")
        elif event == "route":
            fallback = f", fallback {data['fallback']}" if data.get("fallback") else ""
            c.print(f"[dim]· routed to {data.get('model')} ({data.get('tier')}, "
                    f"~${data.get('estimated_cost_usd', 0):.4f}{fallback})[/dim]")
        elif event == "anomaly":
            c.print(f"[yellow]! {data.get('kind')}[/yellow] ({data.get('severity')}): "
                    f"{escape(data.get('message', ''))}")
        elif event == "recovery":
            self._show_recovery(data)
        elif event == "tool_call":
            c.print(f"[yellow]→ {escape(str(data['name']))}[/yellow]({escape(_args(data.get('arguments', {})))}) "
                    f"[dim]{data['call_id']}[/dim]")
        elif event == "tool_progress":
            c.print(f"[dim]  … {escape(str(data['name']))} still running ({data['elapsed_ms'] // 1000}s)[/dim]")
        elif event == "tool_result":
            if data.get("is_error"):
                content = data.get("content") or {}
                msg = content.get("message") or content.get("error") if isinstance(content, dict) else content
                c.print(f"[red]✗ {escape(str(data['name']))}[/red] {data.get('error_code')}: {escape(str(msg))}")
            else:
                c.print(f"[green]✓ {escape(str(data['name']))}[/green] [dim]{data.get('elapsed_ms', 0)} ms"
                        f"{', truncated' if data.get('truncated') else ''}[/dim]")
        elif event == "proposal":
            c.print(f"[magenta]⚑ proposal {data['proposal_id']}[/magenta]: {data['action']} {data['product']} — "
                    f"{escape(data.get('rationale', ''))} (awaits a human)")
        elif event == "error" and (data.get("fatal") is False or data.get("code") in WARNING_CODES):
            c.print(f"[yellow]! {data.get('code')}[/yellow]: {escape(data.get('message', ''))}")
        elif event == "error":
            c.print(f"[red]! {data.get('code')}[/red]: {escape(data.get('message', ''))}")
        elif event == "done":
            usage = data.get("usage") or {}
            by = f" · {self._model}" if self._model and data.get("status") == "done" else ""
            c.print(f"\n[dim]· {data.get('status')}{by} · {usage.get('input_tokens', 0)} in / "
                    f"{usage.get('output_tokens', 0)} out tokens · ${usage.get('cost_usd', 0):.4f}[/dim]")

    def _show_recovery(self, data: dict[str, Any]) -> None:
        action = data.get("action")
        if action == "continue":  # the anomaly line said what; the step goes on as it was
            return
        if data.get("model"):
            self._model = data["model"]
        on = f" on {data['model']}" if data.get("model") else ""
        mark = "[red]■ escalate[/red]" if action == "escalate" else f"[yellow]↻ {action}{on}[/yellow]"
        # A retry or a rollback follows text already printed: say so, or it reads as one answer.
        self.console.print(f"{mark}: {escape(data.get('message', ''))}")
