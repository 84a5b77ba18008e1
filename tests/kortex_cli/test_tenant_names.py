"""A tenant's name on the command line: one line of printable text, or nothing is made."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from kortex_cli.main import app


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "kortex"


@pytest.mark.parametrize("name,code", [("\x1b[31mred", "U+001B"), ("acme\nforged", "U+000A"), ("\x9b2J", "U+009B")])
def test_a_tenant_name_with_a_control_character_is_refused_and_nothing_is_made(home: Path, name: str,
                                                                               code: str) -> None:
    runner = CliRunner()
    refused = runner.invoke(app, ["admin", "create-tenant", name])
    # As any refusal of the domain (a tenant that exists, ...): said on one line, exit 1.
    assert refused.exit_code == 1, refused.output
    assert f"name contains a control character ({code})" in refused.output
    assert name not in refused.output  # not echoed: it would act on the terminal
    assert runner.invoke(app, ["admin", "create-tenant", "acme"]).exit_code == 0
    engine = create_engine(f"sqlite:///{home / 'kortex.db'}")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM tenants")).scalars().all() == ["acme"]
    engine.dispose()



def test_list_keys_prints_a_key_name_as_written_not_as_markup(home: Path) -> None:
    from kortex import keys
    from kortex_cli.runner import _with_container

    runner = CliRunner()
    assert runner.invoke(app, ["admin", "create-tenant", "acme"]).exit_code == 0
    _with_container(lambda k: keys.create_key(k, keys.tenant_by_name(k, "acme").id, name="[bold]ci[/bold] [red]",
                                              by="test"))
    listed = runner.invoke(app, ["admin", "list-keys", "acme"])
    assert listed.exit_code == 0, listed.output
    assert "[bold]ci[/bold] [red]" in listed.stdout  # rich read it as markup: "ci", and a red rest
