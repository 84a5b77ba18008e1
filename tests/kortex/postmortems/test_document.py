"""The post-mortem document: what it requires, what it refuses, how it reads."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kortex.postmortems.document import PostMortem, input_schema


def _doc(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "title": "Checkout latency after v2.14.0", "incident_id": "INC-1042", "product": "checkout",
        "severity": "error", "summary": "A deploy shrank the database pool; requests queued for connections.",
        "impact": {"who": "checkout users", "duration_minutes": 42, "magnitude": "p99 0.21 s to 1.92 s",
                   "citations": ["call_m"]},
        "timeline": [{"at": "2026-11-24T06:02:00Z", "event": "v2.14.0 deployed", "citations": ["call_d"]},
                     {"at": "2026-11-24T06:04:00Z", "event": "p99 rises", "citations": ["call_m"]}],
        "root_cause": {"statement": "pool max_size 10 in v2.14.0", "citations": ["call_a", "call_d"]},
        "contributing_factors": [{"statement": "no saturation alert", "citations": ["call_i"]}],
        "detection": "an alert on p99 after 2 minutes", "resolution": "rolled back",
        "action_items": [{"action": "alert on pool saturation", "owner_role": "checkout on-call",
                          "priority": "P1", "due_in_days": 7}],
        "open_questions": ["why the config changed in the deploy"],
    }
    doc.update(overrides)
    return doc


def test_a_complete_document_validates_lists_its_citations_and_reads_as_markdown() -> None:
    pm = PostMortem.model_validate(_doc())
    assert pm.cited() == ["call_m", "call_d", "call_a", "call_i"]
    md = pm.markdown()
    assert md.startswith("# Checkout latency after v2.14.0\n")
    assert "- 2026-11-24 06:02 — v2.14.0 deployed [call_d]" in md
    assert "| P1 | alert on pool saturation | checkout on-call | 7 days |" in md
    assert "## Open questions" in md and "pool max_size 10 in v2.14.0 [call_a, call_d]" in md


@pytest.mark.parametrize(("change", "where"), [
    ({"timeline": []}, "timeline"),
    ({"root_cause": {"statement": "a guess", "citations": []}}, "root_cause.citations"),
    ({"severity": "sev1"}, "severity"),
    ({"action_items": [{"action": "x", "owner_role": "y", "priority": "urgent", "due_in_days": 3}]},
     "action_items.0.priority"),
    ({"verdict": "blame Bob"}, "verdict"),
    ({"summary": "   "}, "summary"),
])
def test_an_incomplete_or_loose_document_is_refused_saying_where(change: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as refused:
        PostMortem.model_validate(_doc(**change))
    assert where in {".".join(str(p) for p in e["loc"]) for e in refused.value.errors()}


def test_the_tool_schema_is_the_document_s_json_schema() -> None:
    schema = input_schema()
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert {"title", "incident_id", "timeline", "root_cause", "action_items"} <= set(schema["required"])
