"""The CLI drops events of superseded step attempts and says when a step starts over."""

from __future__ import annotations

import io

from rich.console import Console

from kortex_cli.render import EventPrinter


def test_a_rerun_step_is_announced_and_the_old_attempts_late_text_dropped() -> None:
    out = io.StringIO()
    printer = EventPrinter(Console(file=out, width=200, color_system=None))
    events = [
        ("turn", {"status": "running", "step": 0, "attempt": 1, "seq": 1}),
        ("text", {"step": 0, "delta": "tok01 ", "attempt": 1, "seq": 2}),
        ("turn", {"status": "running", "step": 0, "attempt": 2, "seq": 3}),  # the worker died; again
        ("text", {"step": 0, "delta": "tok05 ", "attempt": 1, "seq": 4}),    # the old attempt, late
        ("text", {"step": 0, "delta": "tok01 tok02", "attempt": 2, "seq": 5}),
        ("done", {"status": "done", "usage": {}, "attempt": 2, "seq": 6}),
    ]
    for event, data in events:
        printer.show(event, data)
    text = out.getvalue()
    assert "tok05" not in text
    assert "step 0 is starting again" in text
    assert text.index("starting again") < text.index("tok01 tok02")


def test_json_output_drops_superseded_events_too() -> None:
    out = io.StringIO()
    printer = EventPrinter(Console(file=out), as_json=True)
    import contextlib
    import sys

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        printer.show("turn", {"status": "running", "step": 1, "attempt": 3})
        printer.show("text", {"step": 1, "delta": "old", "attempt": 2})
        printer.show("text", {"step": 1, "delta": "new", "attempt": 3})
    assert sys.stdout is not captured
    lines = captured.getvalue().splitlines()
    assert len(lines) == 2 and "old" not in captured.getvalue()
