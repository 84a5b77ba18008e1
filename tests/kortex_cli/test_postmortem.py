"""`kortex postmortem run` and `export` in the embedded mode: a progress bar, a summary table and
one file per incident, on a fresh home after `kortex seed incident-archive`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kortex.postmortems.document import PostMortem
from kortex_cli.main import app


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


def test_run_writes_a_file_per_incident_and_export_writes_them_again(home: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["seed", "incident-archive"], catch_exceptions=False).exit_code == 0
    out = home / "pm"
    ran = runner.invoke(app, ["postmortem", "run", "--since", "30d", "--product", "checkout", "--out", str(out)],
                        catch_exceptions=False)
    assert ran.exit_code == 0, ran.output
    assert "post-mortems" in ran.output and "done 3" in ran.output  # the progress line, at its end
    files = sorted(p.name for p in out.iterdir())
    assert files == ["INC-1101.md", "INC-1116.md", "INC-1134.md"], ran.output
    assert all(f in ran.output for f in ("INC-1101", "INC-1116", "INC-1134"))  # the summary table
    assert (out / "INC-1116.md").read_text().startswith("# Post-mortem: checkout errors after feature flag")

    job_id = re.search(r"job ([0-9a-f-]{36})", ran.output).group(1)  # type: ignore[union-attr]
    exported = runner.invoke(app, ["postmortem", "export", job_id, "--format", "json", "--out", str(home / "js")],
                             catch_exceptions=False)
    assert exported.exit_code == 0 and "wrote 3 post-mortems" in exported.output, exported.output
    document = json.loads((home / "js" / "INC-1101.json").read_text())["document"]
    assert PostMortem.model_validate(document).incident_id == "INC-1101"

    again = runner.invoke(app, ["postmortem", "run", "--ids", "INC-1101", "--out", str(home / "again")],
                          catch_exceptions=False)
    assert again.exit_code == 0 and "skipped" in again.output  # done before: not redone, not billed
    assert (home / "again" / "INC-1101.md").exists()


def test_run_says_what_is_missing(home: Path) -> None:
    runner = CliRunner()
    nobody = runner.invoke(app, ["postmortem", "run", "--since", "30d", "--tenant", "nobody"])
    assert nobody.exit_code == 1 and "kortex seed incident-archive --tenant nobody" in " ".join(nobody.stderr.split())
    assert nobody.stdout == ""


@pytest.mark.parametrize(("args", "said"), [
    ([], "give either --since"),
    (["--since", "30d", "--ids", "INC-1101"], "give either --since"),
    (["--since", "30d", "--format", "pdf"], "--format must be md or json"),
    (["--since", "30d", "--url", "http://127.0.0.1:9"], "--api-key (or KORTEX_API_KEY) is required with --url"),
])
def test_a_command_line_it_cannot_use_is_a_usage_error_on_stderr(home: Path, args: list[str], said: str) -> None:
    result = CliRunner().invoke(app, ["postmortem", "run", *args])
    assert result.exit_code == 2, result.output
    assert said in result.stderr and result.stdout == ""


def test_a_refused_request_names_each_option_at_fault(home: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["seed", "incident-archive"], catch_exceptions=False).exit_code == 0
    none = runner.invoke(app, ["postmortem", "run", "--since", "30d", "--concurrency", "0"])
    assert none.exit_code == 2 and "--concurrency" in none.stderr, none.output
    bad = runner.invoke(app, ["postmortem", "run", "--since", "30d", "--max-usd", "0", "--concurrency", "99"])
    assert bad.exit_code == 2 and bad.stdout == ""
    assert bad.stderr == ("error: the request is not valid: --max-usd: Input should be greater than 0; "
                          "--concurrency: Input should be less than or equal to 32\n")
