"""Run the ``kortex`` command with one function held at a gate, for tests that stop the command
at a moment of their choosing rather than by racing it with sleeps:

    python -m tests.kortex_cli.gated_cli MODULE:ATTR before|after N -- kortex arguments...

The N-th call of ``ATTR`` (a function, or ``Class.method``) writes ``gate: MODULE:ATTR`` on
stderr and waits for a line (or the end) on stdin, before or after the real call runs. The
command's code is not changed: only when it gets there is.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any


def install(target: str, when: str, nth: int) -> None:
    module_name, _, path = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    real = getattr(owner, name)
    calls = 0

    @functools.wraps(real)
    def gated(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls != nth:
            return real(*args, **kwargs)
        if when == "after":
            result = real(*args, **kwargs)
            _wait(target)
            return result
        _wait(target)
        return real(*args, **kwargs)

    setattr(owner, name, gated)


def _wait(target: str) -> None:
    sys.stderr.write(f"gate: {target}\n")
    sys.stderr.flush()
    sys.stdin.readline()


if __name__ == "__main__":
    gate_target, gate_when, gate_nth, separator, *argv = sys.argv[1:]
    assert gate_when in ("before", "after") and separator == "--", sys.argv
    install(gate_target, gate_when, int(gate_nth))
    from kortex_cli.main import main

    main(argv)
