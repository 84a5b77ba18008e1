"""The ``kortex`` console script's entry point. It imports nothing but the standard library
before it can answer Ctrl-C: the command line's own imports (pydantic, typer, rich, the domain)
take a good part of a second, and a Ctrl-C landing in them printed a traceback instead of
ending quietly with 130 like a Ctrl-C anywhere else."""

from __future__ import annotations

import sys
from typing import Any


def main() -> Any:
    try:
        from kortex_cli.main import main as run
    except KeyboardInterrupt:
        sys.exit(130)
    return run()
