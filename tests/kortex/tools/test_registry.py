"""The registry's view of tools for a model: what a policy allows, built once per policy."""

from __future__ import annotations

import dataclasses

from kortex.tools.builtin import BUILTIN_TOOLS
from kortex.tools.policy import ToolPolicy
from kortex.tools.registry import ToolRegistry


def test_schemas_follow_the_policy_and_are_built_once_per_policy() -> None:
    registry = ToolRegistry(BUILTIN_TOOLS)
    names = sorted(s.name for s in BUILTIN_TOOLS)
    wide = ToolPolicy(allowed=frozenset(names))
    narrow = wide.narrowed(names[:2])
    first = registry.schemas(wide)
    assert sorted(s.name for s in first) == sorted(s.name for s in registry.catalog(wide))
    assert [s.name for s in registry.schemas(narrow)] == [s.name for s in registry.catalog(narrow)]
    assert len(registry.schemas(narrow)) == 2
    assert registry.schemas(wide) is first  # the same tuple: no models rebuilt per step
    assert registry.schemas(ToolPolicy(allowed=frozenset(names))) is first  # an equal policy hits too
    registry.register(dataclasses.replace(BUILTIN_TOOLS[0], name="zz_extra"))
    again = registry.schemas(ToolPolicy(allowed=frozenset([*names, "zz_extra"])))
    assert "zz_extra" in [s.name for s in again]  # registering a tool drops what was built
    assert registry.schemas(wide) is not first
