"""The ``postmortem`` kind of turn: one incident of a batch job investigated on the batch lane,
with the post-mortem writer's prompt, the investigation tools plus ``submit_postmortem`` (no
``propose_action``: a post-mortem proposes nothing), its own budget scope, the job's budget
checked before each LLM call (and held against its calls in flight), and the job's bookkeeping when the turn ends."""

from __future__ import annotations

from kortex.postmortems import jobs
from kortex.prompts import POSTMORTEM_WRITER
from kortex.tools.builtin import BUILTIN_TOOLS
from kortex.turns.ports import JOB_SWEEPS
from kortex.turns.profiles import TurnProfile, register

POSTMORTEM = TurnProfile(
    name=jobs.PROFILE,
    system=POSTMORTEM_WRITER,
    tools=frozenset(s.name for s in BUILTIN_TOOLS if s.name != "propose_action"),
    budget_scope="postmortem",
    lane="batch",
    on_end=jobs.on_end,
    before_call=jobs.before_call,
    spend_cap=jobs.spend_cap,
)

register(POSTMORTEM)
JOB_SWEEPS.append(jobs.sweep)
