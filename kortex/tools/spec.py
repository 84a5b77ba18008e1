"""What a tool is: a spec (name, description, input model, effect, category, redaction
allowlist) plus a run function. Tools receive their I/O through ``ToolContext``.

Run functions are plain blocking functions: the pipeline runs them on its own threads and
bounds them with a timeout, and every source a tool reads enforces a deadline of its own
(statement timeouts, HTTP timeouts) so an abandoned call still ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from kortex.redaction import Allowlist

if TYPE_CHECKING:
    from kortex.telemetry.sources import TelemetrySources


class Effect(StrEnum):
    READ_ONLY = "read_only"
    STATE_CHANGE = "state_change"
    EXTERNAL_SIDE_EFFECT = "external_side_effect"


@dataclass(frozen=True, slots=True)
class Category:
    """Time limits of a family of tools (rfc-005 §6.1): a default and a hard ceiling."""

    name: str
    default_timeout: float
    max_timeout: float


CATEGORIES: dict[str, Category] = {
    c.name: c
    for c in (
        Category("query", 30.0, 300.0),      # get_logs, get_metrics, get_traces
        Category("analysis", 10.0, 60.0),    # compare_to_baseline, get_recent_deploys
        Category("lookup", 5.0, 30.0),       # get_incident_history, get_admin_info, LLM-ops lookups
        Category("action", 5.0, 30.0),       # propose_action
    )
}


class ToolInput(BaseModel):
    """Base of every tool's argument model: unknown arguments are an error the model can fix."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


@dataclass(slots=True)
class ToolContext:
    """Everything a tool may touch. References only: no secrets, no raw credentials."""

    tenant_id: str
    session_id: str | None
    turn_id: str | None
    call_id: str
    step: int
    now: datetime
    sources: TelemetrySources
    services: dict[str, Any] = field(default_factory=dict)  # cursors, proposals, ...
    #: stream events to publish once the result is stored (e.g. a proposal card)
    events: list[Any] = field(default_factory=list)
    #: the output cap the pipeline will apply (a tool may size its pages to it)
    result_cap_bytes: int = 64 * 1024
    #: ``time.monotonic()`` at which the pipeline stops waiting for this call (set when it runs)
    deadline: float | None = None


RunFn = Callable[[Any, ToolContext], dict[str, Any]]
RecoverFn = Callable[["ToolContext"], dict[str, Any] | None]
TruncateFn = Callable[[dict[str, Any], Any, int, "ToolContext"], dict[str, Any]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_model: type[ToolInput]
    run: RunFn
    effect: Effect = Effect.READ_ONLY
    category: str = "lookup"
    redact: tuple[str, ...] = ()
    #: the list the output cap trims first when a result is too large
    list_field: str | None = None
    #: which end of that list the cap keeps: "head" for newest-first pages, "tail" for series
    #: sorted oldest-first, whose latest points matter most to an investigation
    keep: Literal["head", "tail"] = "head"
    #: fixes paging fields (next_cursor) after the cap kept only the first ``kept`` items
    on_truncate: TruncateFn | None = None
    #: for tools with an effect: the stored outcome of a call whose worker died before its
    #: result was kept (the watchdog answers with it instead of a timeout)
    recover: RecoverFn | None = None
    #: the turn profiles offered this tool (kortex/turns/profiles.py); None: all of them. An
    #: output channel (submit_postmortem) is no investigation tool, so chat never sees it.
    profiles: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"tool {self.name}: unknown category {self.category!r}")
        if not self.redact:
            raise ValueError(f"tool {self.name}: a redaction allowlist is required")

    @cached_property
    def allowlist(self) -> Allowlist:
        return Allowlist(self.redact)

    @cached_property
    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema the model sees, derived from the input model (never hand-written)."""
        schema = self.input_model.model_json_schema()
        return _clean_schema(schema)

    @property
    def limits(self) -> Category:
        return CATEGORIES[self.category]

    def timeout(self, override: float | None = None) -> float:
        """The configured timeout, clamped to the category's hard ceiling."""
        value = override if override is not None else self.limits.default_timeout
        return max(0.05, min(value, self.limits.max_timeout))


def _clean_schema(schema: dict[str, Any], names: bool = False) -> dict[str, Any]:
    """Drop pydantic's ``title`` annotations (they only cost prompt tokens). ``names`` marks a
    ``properties`` mapping, whose keys are argument names and must all stay."""
    return {
        k: _clean_node(v, names=(k in ("properties", "$defs") and not names))
        for k, v in schema.items()
        if names or not (k == "title" and isinstance(v, str))
    }


def _clean_node(node: Any, names: bool = False) -> Any:
    if isinstance(node, dict):
        return _clean_schema(node, names)
    if isinstance(node, list):
        return [_clean_node(v) for v in node]
    return node
