"""One tool call of a turn (kortex/turns/toolrun.py): what it adds to the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from kortex import metrics


def _tool_labels() -> set[str]:
    return {s.labels["tool"] for m in metrics.TOOL_SECONDS.collect() for s in m.samples}


def test_tool_names_the_model_makes_up_share_one_metric_label(harness_factory: Any, tmp_path: Path) -> None:
    made_up = [f"made_up_tool_{i}" for i in range(5)]
    calls = [{"id": f"c{i}", "name": name, "arguments": {}} for i, name in enumerate(made_up)]
    calls.append({"id": "c_real", "name": "get_recent_deploys",
                  "arguments": {"product": "checkout", "time_range": "last 2h"}})
    (tmp_path / "made_up.json").write_text(json.dumps({"steps": [
        {"text": ["Looking."], "tool_calls": calls}, {"text": ["Done."]}]}))
    h = harness_factory(testing={"scripts_dir": tmp_path})
    tenant = h.tenant("acme")
    h.seed(tenant)

    def count(tool: str, outcome: str) -> float:
        return REGISTRY.get_sample_value("kortex_tool_duration_seconds_count", {"tool": tool, "outcome": outcome}) or 0

    denied, deploys = count("unknown", "policy_denied"), count("get_recent_deploys", "ok")
    turn = h.ask(tenant, "why?", model="scripted:made_up")
    assert turn.status == "done"
    assert count("unknown", "policy_denied") == denied + 5
    assert count("get_recent_deploys", "ok") == deploys + 1  # a registered tool keeps its name
    assert not _tool_labels() & set(made_up)
