"""The kinds of turn: what a step tells the model and lets it do is data, not a branch in
step.py. A profile names the system prompt, the tools the model is offered (narrower than the
deployment's policy, never wider), the budget scope its spend counts under, the lane its work
is queued on, and an optional hook run in the transaction that ends the turn, however it ends
(done, failed, cancelled, expired): a batch job's bookkeeping, say, which may hand more work on.

Chat is the profile every turn had before; a post-mortem item (issue 12) is the next. A turn
stores its profile's name, so a step resumed on another worker runs it the same way; an
unknown name is a configuration error of that deployment, reported as the turn's failure.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy.engine import Connection

from kortex.container import Kortex
from kortex.errors import ConfigError, KortexError
from kortex.llm.base import ToolSchema
from kortex.messages import Message
from kortex.prompts import INVESTIGATOR
from kortex.storage.records import TurnRecord
from kortex.tools.policy import ToolPolicy
from kortex.turns.handoff import Handoff, Lane
from kortex.turns.spendguard import SpendCap


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How a turn ended, as its end hook hears it."""

    status: Literal["done", "failed", "cancelled"]
    answer: str | None = None  # the final answer's text, when it ended done
    error: str | None = None   # the error code, when it did not


#: what a profile's end hook receives: the container, the transaction whose compare-and-set
#: ended the turn, the turn (as it was before it ended) and how it ended; it returns work to
#: hand on once that transaction commits
EndHook = Callable[[Kortex, Connection, TurnRecord, TurnEnd], Handoff]


@dataclass(frozen=True)
class TurnProfile:
    name: str
    system: str
    #: tool names this profile may offer (None: every tool the deployment's policy allows)
    tools: frozenset[str] | None = None
    budget_scope: str = "chat"
    lane: Lane = "chat"
    on_end: EndHook | None = field(default=None, compare=False)
    #: checked before every LLM call of the turn, in the transaction that claims the step, with
    #: the conversation so far: an error ends the turn with its code (a batch job's spent
    #: ``max_usd``, a document the model failed to get valid), None lets the call go ahead
    before_call: Callable[[Connection, TurnRecord, list[Message]], KortexError | None] | None = \
        field(default=None, compare=False)
    #: a budget of this kind of work's own beside the tenant's day (a batch job's ``max_usd``):
    #: each step reserves what its call may cost against it too (kortex/turns/spendguard.py)
    spend_cap: Callable[[Connection, TurnRecord], SpendCap | None] | None = field(default=None, compare=False)

    def policy(self, k: Kortex) -> ToolPolicy:
        """The deployment's policy, narrowed to this profile's tools: a profile can take tools
        away, never add one the deployment did not allow."""
        # An output channel such as submit_postmortem is offered only to the profiles it names.
        return k.policy.narrowed(k.tools.offered(self.name, self.tools))

    def tool_schemas(self, k: Kortex) -> tuple[ToolSchema, ...]:
        return k.tools.schemas(self.policy(k))


CHAT = TurnProfile(name="chat", system=INVESTIGATOR)

_PROFILES: dict[str, TurnProfile] = {CHAT.name: CHAT}
#: modules that define the product's other profiles, imported on first lookup: every process
#: (API, workers, beat) must know every kind of turn it may meet, without the turn engine
#: importing the rooms built on it
_BUILTIN = ("kortex.postmortems.profile",)
_loaded = False
_load_lock = threading.RLock()  # re-entrant: a profile module's own imports may look profiles up


def load_builtin() -> None:
    """Import the product's profile modules (once): they register their profiles and sweeps.
    Under a lock, and marked done only after the imports: a second thread must never look up a
    profile while the first is still registering it."""
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if not _loaded:
            for module in _BUILTIN:
                importlib.import_module(module)
            _loaded = True


def register(profile: TurnProfile) -> None:
    """Add a kind of turn (at import of the module that defines it)."""
    if profile.name in _PROFILES and _PROFILES[profile.name] is not profile:
        raise ValueError(f"a turn profile named {profile.name!r} is already registered")
    _PROFILES[profile.name] = profile


def profile_of(name: str) -> TurnProfile:
    load_builtin()
    try:
        return _PROFILES[name]
    except KeyError:
        raise ConfigError(f"turn profile {name!r} is not known to this process; known: {', '.join(_PROFILES)}") \
            from None


def names() -> list[str]:
    load_builtin()
    return list(_PROFILES)


def lane_of(name: str) -> Lane:
    """The lane of a stored turn's profile; chat for a profile this process does not know (its
    step fails the turn as ``unknown_profile``, which chat workers can do as well as any)."""
    load_builtin()
    found = _PROFILES.get(name)
    return found.lane if found is not None else "chat"


__all__ = ["CHAT", "EndHook", "TurnEnd", "TurnProfile", "lane_of", "load_builtin", "names", "profile_of", "register"]
