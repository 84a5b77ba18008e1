"""Ctrl-C while the ``kortex`` command is still importing ends it quietly with 130, as a Ctrl-C
during any command does: no traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

# What the console script generated from pyproject.toml runs.
SCRIPT = "import sys; from kortex_cli.entry import main; sys.exit(main())"


def _loaded(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_ctrl_c_during_the_commands_imports_exits_130_without_a_traceback() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # pydantic's compiled core is loaded by the first of the command's own imports, well before
    # they end: the Ctrl-C lands among them, not before the entry point runs.
    deadline = time.monotonic() + 30
    while not _loaded(proc.pid, "_pydantic_core") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert proc.poll() is None, "the command finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err
    assert proc.returncode == 130
    assert "Usage" not in out  # it stopped there: the help was never printed


def test_the_console_script_points_at_the_entry_module() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'kortex = "kortex_cli.entry:main"' in pyproject
