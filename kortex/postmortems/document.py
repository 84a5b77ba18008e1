"""What a post-mortem is: a typed document the model submits through a structured-output tool
(``submit_postmortem``, whose input schema is this model), validated before it is stored.

Every claim that comes from the investigation cites the tool calls it rests on (``citations``:
ids of that item's own calls, checked as answers are: kortex/turns/grounding.py). Where the
data did not say, the document says so in ``open_questions`` rather than guess.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4000)]
Short = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=300)]
CallId = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Citations = Annotated[list[CallId], Field(max_length=20, description="ids of the tool calls this rests on")]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Impact(_Part):
    who: Text = Field(description="who was affected: users, tenants, internal teams")
    duration_minutes: float | None = Field(None, ge=0, description="from onset to recovery, from the data")
    magnitude: Text = Field(description="how much: error rate, latency, requests or money, from the data")
    citations: Citations = Field(default_factory=list)


class TimelineEntry(_Part):
    at: datetime = Field(description="when, with its time zone (UTC)")
    event: Text
    citations: Citations = Field(min_length=1)


class Finding(_Part):
    statement: Text
    citations: Citations = Field(min_length=1)


class ActionItem(_Part):
    action: Text
    owner_role: Short = Field(description="a role, not a person: 'checkout on-call', 'platform team'")
    priority: Literal["P0", "P1", "P2", "P3"]
    due_in_days: int = Field(ge=0, le=365)


class PostMortem(_Part):
    """A blameless post-mortem of one incident."""

    title: Short
    incident_id: Short = Field(description="the incident's own id, e.g. INC-1042")
    product: Short | None = None
    severity: Literal["info", "warn", "error", "critical"]
    summary: Text = Field(description="three to five sentences: what happened, why, how it ended")
    impact: Impact
    timeline: list[TimelineEntry] = Field(min_length=1, max_length=50, description="in time order")
    root_cause: Finding
    contributing_factors: list[Finding] = Field(default_factory=list, max_length=10)
    detection: Text = Field(description="how the incident was noticed and how long that took")
    resolution: Text
    went_well: list[Text] = Field(default_factory=list, max_length=10)
    went_badly: list[Text] = Field(default_factory=list, max_length=10)
    action_items: list[ActionItem] = Field(min_length=1, max_length=20)
    open_questions: list[Text] = Field(default_factory=list, max_length=10,
                                       description="what the data did not establish")

    def cited(self) -> list[str]:
        """Every call id the document cites, in order of first mention."""
        ids: list[str] = []
        parts = [self.impact.citations, *(e.citations for e in self.timeline), self.root_cause.citations,
                 *(f.citations for f in self.contributing_factors)]
        for citations in parts:
            ids.extend(c for c in citations if c not in ids)
        return ids

    def markdown(self) -> str:
        """The document as a person reads it (``Accept: text/markdown``, ``--format md``)."""
        def cite(ids: list[str]) -> str:
            return f" [{', '.join(ids)}]" if ids else ""

        lines = [f"# {self.title}", "", f"**Incident** {self.incident_id}"
                 + (f" · **product** {self.product}" if self.product else "") + f" · **severity** {self.severity}",
                 "", "## Summary", "", self.summary, "", "## Impact", "",
                 f"- **Who:** {self.impact.who}", f"- **How much:** {self.impact.magnitude}{cite(self.impact.citations)}"]
        if self.impact.duration_minutes is not None:
            lines.append(f"- **How long:** {self.impact.duration_minutes:g} minutes")
        lines += ["", "## Timeline (UTC)", ""]
        lines += [f"- {e.at:%Y-%m-%d %H:%M} — {e.event}{cite(e.citations)}" for e in self.timeline]
        lines += ["", "## Root cause", "", f"{self.root_cause.statement}{cite(self.root_cause.citations)}"]
        if self.contributing_factors:
            lines += ["", "## Contributing factors", ""]
            lines += [f"- {f.statement}{cite(f.citations)}" for f in self.contributing_factors]
        lines += ["", "## Detection", "", self.detection, "", "## Resolution", "", self.resolution]
        for heading, items in (("What went well", self.went_well), ("What went badly", self.went_badly)):
            if items:
                lines += ["", f"## {heading}", "", *[f"- {i}" for i in items]]
        lines += ["", "## Action items", "", "| priority | action | owner | due in |", "|---|---|---|---|"]
        lines += [f"| {a.priority} | {a.action} | {a.owner_role} | {a.due_in_days} days |" for a in self.action_items]
        if self.open_questions:
            lines += ["", "## Open questions", "", *[f"- {q}" for q in self.open_questions]]
        return "\n".join(lines) + "\n"


def input_schema() -> dict[str, object]:
    """The JSON Schema of the document, as the structured-output tool's input schema."""
    return PostMortem.model_json_schema()


__all__ = ["ActionItem", "Finding", "Impact", "PostMortem", "TimelineEntry", "input_schema"]
