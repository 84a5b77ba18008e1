"""The kinds of turn: what a step tells the model and lets it do is data, not a branch in
step.py. A profile names the system prompt, the tools the model is offered (narrower than the
deployment's policy, never wider), the budget scope its spend counts under, and an optional
hook run in the transaction that finishes the turn (a batch job's bookkeeping, say), which may
hand more work on.

Chat is the profile every turn had before; a post-mortem item (issue 12) is the next. A turn
stores its profile's name, so a step resumed on another worker runs it the same way; an
unknown name is a configuration error of that deployment, reported as the turn's failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.engine import Connection

from kortex.container import Kortex
from kortex.errors import ConfigError
from kortex.llm.base import ToolSchema
from kortex.prompts import INVESTIGATOR
from kortex.storage.records import TurnRecord
from kortex.tools.policy import ToolPolicy
from kortex.turns.handoff import Handoff

#: what a profile's finish hook receives: the container, the closing transaction, the turn
#: (before its finish) and the final answer's text; it returns work to hand on
FinishHook = Callable[[Kortex, Connection, TurnRecord, str], Handoff]


@dataclass(frozen=True)
class TurnProfile:
    name: str
    system: str
    #: tool names this profile may offer (None: every tool the deployment's policy allows)
    tools: frozenset[str] | None = None
    budget_scope: str = "chat"
    on_finish: FinishHook | None = field(default=None, compare=False)

    def policy(self, k: Kortex) -> ToolPolicy:
        """The deployment's policy, narrowed to this profile's tools: a profile can take tools
        away, never add one the deployment did not allow."""
        if self.tools is None:
            return k.policy
        return k.policy.narrowed(self.tools)

    def tool_schemas(self, k: Kortex) -> tuple[ToolSchema, ...]:
        return k.tools.schemas(self.policy(k))


CHAT = TurnProfile(name="chat", system=INVESTIGATOR)

_PROFILES: dict[str, TurnProfile] = {CHAT.name: CHAT}


def register(profile: TurnProfile) -> None:
    """Add a kind of turn (at import of the module that defines it)."""
    if profile.name in _PROFILES and _PROFILES[profile.name] is not profile:
        raise ValueError(f"a turn profile named {profile.name!r} is already registered")
    _PROFILES[profile.name] = profile


def profile_of(name: str) -> TurnProfile:
    try:
        return _PROFILES[name]
    except KeyError:
        raise ConfigError(f"turn profile {name!r} is not known to this process; known: {', '.join(_PROFILES)}") \
            from None


def names() -> list[str]:
    return list(_PROFILES)


__all__ = ["CHAT", "FinishHook", "TurnProfile", "names", "profile_of", "register"]
