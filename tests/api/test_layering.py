"""The API reaches the domain through one door: every module of api/ calls kortex/ services and
never kortex.storage (record types come from the services that hand them out), so no route
opens a connection or writes SQL of its own (DESIGN.md, "Where the house is going", 1)."""

from __future__ import annotations

import ast
from pathlib import Path

API = Path(__file__).resolve().parents[2] / "api"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_module_of_the_api_reaches_into_storage() -> None:
    offenders = {
        str(path.relative_to(API.parent)): sorted(n for n in _imports(path) if n.startswith("kortex.storage"))
        for path in sorted(API.rglob("*.py"))
    }
    assert {p: names for p, names in offenders.items() if names} == {}


def test_no_route_opens_a_database_connection() -> None:
    for path in [*sorted((API / "routes").glob("*.py")), API / "deps.py", API / "sse.py"]:
        text = path.read_text()
        assert ".db.connect(" not in text and ".db.begin(" not in text, path.name
