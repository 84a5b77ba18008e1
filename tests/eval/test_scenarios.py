"""The evaluation set stays loadable: every scenario names a question and what its answer must
say, and its telemetry expands into batches the ingest API accepts (validated as ingest does)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from eval.__main__ import PARTS, SCENARIOS, expand
from kortex.telemetry.ingest import validate_batch

FILES = sorted(p for part in PARTS for p in (SCENARIOS / part).glob("*.yaml"))


def test_there_are_at_least_fifteen_scenarios_and_a_third_are_held_out() -> None:
    held_out = [p for p in FILES if p.parent.name == "heldout"]
    assert len(FILES) >= 15 and len(held_out) * 3 >= len(FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_scenario_expands_into_batches_ingest_accepts(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())
    assert spec["question"].strip() and spec["must_name"]
    now = datetime.now(UTC).replace(microsecond=0)
    batches = expand(spec["telemetry"], now)
    assert batches
    for kind, items in batches.items():
        rows = validate_batch(kind, items, now=now)  # raises what a 422 would say
        assert len(rows) == len(items)
