"""submit_postmortem: the structured output of a post-mortem turn (kortex/postmortems/). Its
input schema is the post-mortem document itself, so the pipeline validates the model's document
before anything is stored and an invalid one comes back to the model as a tool error it can fix.
The document is stored by the turn's end hook, from this call's arguments, once the turn ends.

Only post-mortem turns are offered it (``profiles``): it is an output channel, not a tool for
investigating, and a chat model never sees it."""

from __future__ import annotations

from typing import Any

from kortex.errors import InvalidInput
from kortex.postmortems.document import PostMortem
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class SubmitPostmortemInput(PostMortem, ToolInput):
    """A blameless post-mortem of one incident."""


def run(args: SubmitPostmortemInput, ctx: ToolContext) -> dict[str, Any]:
    calls = ctx.services.get("calls")
    if calls is not None and ctx.turn_id is not None:
        # A citation must name a call of this investigation that answered: anything else is
        # dangling, and the model hears which, like any other validation error.
        known = calls.succeeded(ctx.tenant_id, ctx.turn_id)
        dangling = [c for c in args.cited() if c not in known]
        if dangling:
            raise InvalidInput(
                f"citations {', '.join(dangling[:10])} name no successful tool call of this investigation; cite "
                f"only these: {', '.join(sorted(known)[:40]) or 'none yet (investigate first)'}",
                code="validation", details=[{"field": "citations", "message": f"dangling: {c}"} for c in dangling[:10]])
    return {"accepted": True, "incident_id": args.incident_id, "cited_calls": len(args.cited()),
            "timeline_entries": len(args.timeline), "action_items": len(args.action_items)}


SPEC = ToolSpec(
    name="submit_postmortem",
    description="Submit the finished post-mortem of the incident under investigation. Its arguments are the whole "
                "document; citations name tool call ids of this investigation. Invalid documents come back with "
                "the validation errors to fix.",
    input_model=SubmitPostmortemInput,
    run=run,
    category="lookup",
    redact=("accepted", "incident_id", "cited_calls", "timeline_entries", "action_items"),
    profiles=frozenset({"postmortem"}),
)
