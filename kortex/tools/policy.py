"""Which tools may run: policy as data, deny by default (tool-use-spec §2)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from kortex.tools.spec import Effect, ToolSpec

Decision = Literal["allow", "deny", "require_approval"]


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """An explicit allowlist. Tools with a write effect that are not named in it need approval,
    which no model can give, so they do not run."""

    allowed: frozenset[str]
    approval_effects: frozenset[Effect] = frozenset({Effect.STATE_CHANGE, Effect.EXTERNAL_SIDE_EFFECT})
    explicit: frozenset[str] = frozenset()

    @classmethod
    def build(cls, configured: Iterable[str] | None, specs: Iterable[ToolSpec],
              default_extra: Iterable[str] = ()) -> ToolPolicy:
        """``configured`` lists tool names; None means every registered read-only tool plus
        ``default_extra`` (tools the product ships enabled, such as propose_action)."""
        specs = list(specs)
        if configured is None:
            names = {s.name for s in specs if s.effect is Effect.READ_ONLY} | set(default_extra)
            return cls(allowed=frozenset(names), explicit=frozenset(default_extra))
        names = set(configured)
        return cls(allowed=frozenset(names), explicit=frozenset(names))

    def decide(self, spec: ToolSpec) -> Decision:
        if spec.name not in self.allowed:
            return "deny"
        if spec.effect in self.approval_effects and spec.name not in self.explicit:
            return "require_approval"
        return "allow"

    def narrowed(self, names: Iterable[str] | None) -> ToolPolicy:
        """This policy limited further (a tenant's own allowlist); never widened."""
        if names is None:
            return self
        keep = self.allowed & frozenset(names)
        return ToolPolicy(allowed=keep, approval_effects=self.approval_effects, explicit=self.explicit & keep)
